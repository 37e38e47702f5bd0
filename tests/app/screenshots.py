"""Screenshots of every page with real runs: ``.venv/bin/python tests/app/screenshots.py``.

Starts the stack (embedded Redis, one worker, Streamlit), submits a DP/DDP pair of the same
config, then a DDP run that fails on purpose (fault=raise on rank 1), and writes
docs/screenshots/{launch,launch-error,live-running,live,live-failed,runs}.png.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from stack import ROOT, AppStack, launch_browser  # noqa: E402

OUT = ROOT / "docs" / "screenshots"
CONFIG = {"world_size": 2, "steps": 80, "width": 256, "depth": 3, "bucket_cap_mb": 0.1,
          "step_delay_s": 0.05, "eval_every": 0}
VIEW = {"width": 1500, "height": 1000}
LIVE_HEIGHT = 2150


def _settle(page, charts: int = 0, timeout_s: float = 60) -> None:
    """Wait for `charts` drawn Vega charts, then a moment for fonts and layout."""
    if charts:
        page.locator(".vega-embed canvas, .vega-embed svg").nth(charts - 1).wait_for(
            timeout=timeout_s * 1000)
    page.wait_for_timeout(1500)


def shoot(page, name: str, height: int = VIEW["height"]) -> None:
    """Streamlit scrolls inside its own container, so the viewport is made as tall as the page."""
    page.set_viewport_size({"width": VIEW["width"], "height": height})
    page.wait_for_timeout(1500)
    page.screenshot(path=str(OUT / f"{name}.png"))
    print("wrote", OUT / f"{name}.png")


def main() -> None:
    from playwright.sync_api import sync_playwright
    from workers.client import DdpvizClient

    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, AppStack(Path(tmp)) as stack, \
            sync_playwright() as pw:
        browser = launch_browser(pw)
        page = browser.new_page(viewport=VIEW)
        page.goto(stack.url)
        page.get_by_role("heading", name="Launch a run").wait_for()
        _settle(page)
        shoot(page, "launch", 1150)
        box = page.locator('input[aria-label="world_size"]')
        box.fill("0")
        box.press("Tab")
        page.get_by_role("button", name="Launch", exact=True).click()
        page.get_by_text("Not launched").wait_for()
        _settle(page)
        shoot(page, "launch-error", 1300)

        client = DdpvizClient(url=stack.redis_url)
        dp_id, ddp_id = client.submit_pair(CONFIG)
        page.goto(f"{stack.url}/live?runs={dp_id},{ddp_id}")
        page.get_by_role("heading", name="Live").wait_for()
        deadline = time.monotonic() + 120
        while client.get_run(dp_id)["status"] != "finished" or \
                client.get_run(ddp_id)["status"] == "queued":
            assert time.monotonic() < deadline, "runs too slow"
            time.sleep(0.5)
        time.sleep(3)  # DDP ranks spawned and stepping
        _settle(page, charts=3)
        shoot(page, "live-running", LIVE_HEIGHT)
        while client.get_run(ddp_id)["status"] not in ("finished", "failed", "canceled"):
            assert time.monotonic() < deadline + 120, "ddp run too slow"
            time.sleep(0.5)
        time.sleep(3)
        _settle(page, charts=6)
        shoot(page, "live", LIVE_HEIGHT)
        bad = client.submit({**CONFIG, "mode": "ddp", "steps": 20, "fault": "raise",
                             "fault_rank": 1, "fault_step": 5}, label="DDP, rank 1 raises")
        while client.get_run(bad)["status"] not in ("finished", "failed", "canceled"):
            assert time.monotonic() < deadline + 240, "failing run too slow"
            time.sleep(0.5)
        page.set_viewport_size(VIEW)
        page.goto(f"{stack.url}/live?runs={bad}")
        page.get_by_text("Run failed").wait_for()
        _settle(page, charts=2)
        shoot(page, "live-failed", 1600)
        page.set_viewport_size(VIEW)
        page.goto(f"{stack.url}/runs")
        page.get_by_role("heading", name="Runs").wait_for()
        _settle(page)
        shoot(page, "runs")
        browser.close()


if __name__ == "__main__":
    main()
