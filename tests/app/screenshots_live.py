"""Screenshot of the Live page on a long run: ``.venv/bin/python tests/app/screenshots_live.py``.

Starts the stack (embedded Redis, one worker, Streamlit), runs a labelled DP/DDP pair of 1,500
steps with several gradient buckets, and writes docs/screenshots/live-long.png: the throughput
chart with the steps before the newest 500 in bins, validation accuracy, and the per-bucket
timeline of the latest step. (`tests/app/screenshots.py` makes the other pages' screenshots.)
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from stack import ROOT, AppStack, launch_browser  # noqa: E402

OUT = ROOT / "docs" / "screenshots"
CONFIG = {"world_size": 2, "width": 32, "depth": 2, "global_batch_size": 32, "steps": 1500,
          "step_delay_s": 0.0, "eval_every": 100, "bucket_cap_mb": 0.002, "optimizer": "adamw",
          "lr": 0.003}
VIEW = {"width": 1500, "height": 1000}


def main() -> None:
    from playwright.sync_api import sync_playwright

    from ddpviz.workers.client import DdpvizClient

    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, AppStack(Path(tmp)) as stack, sync_playwright() as pw:
        client = DdpvizClient(url=stack.redis_url)
        ids = client.submit_pair(CONFIG, label="1,500 steps")
        deadline = time.monotonic() + 1800
        while any(client.get_run(i)["status"] not in ("succeeded", "failed", "canceled") for i in ids):
            assert time.monotonic() < deadline, "runs too slow"
            time.sleep(2)
        browser = launch_browser(pw)
        page = browser.new_page(viewport=VIEW)
        page.goto(f"{stack.url}/live?runs={','.join(ids)}")
        page.get_by_role("heading", name="Live").wait_for()
        page.locator('[data-testid="stVegaLiteChart"]').nth(6).wait_for(timeout=120_000)
        page.wait_for_timeout(3000)
        height = page.evaluate("() => document.querySelector('[data-testid=\"stMain\"]').scrollHeight") + 40
        page.set_viewport_size({"width": VIEW["width"], "height": min(4000, height)})
        page.wait_for_timeout(2000)
        page.screenshot(path=str(OUT / "live-long.png"))
        print("wrote", OUT / "live-long.png")
        browser.close()


if __name__ == "__main__":
    main()
