"""Screenshots of the pages issue 33 asked to be honest, on recorded real runs (no training):
``.venv/bin/python tests/app/screenshots_recorded.py [OUT]``.

Starts the stack, plays the recorded attached run (`recorded.ATTACHED`: `ddpviz run -- torchrun`
of examples/attach/train_regression.py, 2 ranks, gloo) and the recorded DDP overlap on/off pair into
its Redis, and writes OUT/attached-compare.png (Compare on the attached run: peak memory and bytes
in the unit that suits them, every bar labelled), OUT/attached-theory.png (Theory in the run's own
backend's words), OUT/buckets-typical.png (the Bucket timeline opening on a typical step) and
OUT/runs-wall.png (Runs with wall time and validation accuracy). OUT defaults to docs/screenshots.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from stack import ROOT, AppStack, launch_browser  # noqa: E402

VIEW = {"width": 1500, "height": 1000}


def shoot(page, out: Path, name: str, url: str, heading: str, charts: int) -> None:
    page.goto(url)
    page.get_by_role("heading", name=heading).wait_for()
    if charts:
        page.locator(".vega-embed canvas, .vega-embed svg").nth(charts - 1).wait_for(timeout=60_000)
    page.wait_for_timeout(2500)
    height = page.evaluate("() => document.querySelector('[data-testid=\"stMain\"]').scrollHeight") + 40
    page.set_viewport_size({"width": VIEW["width"], "height": min(4000, height)})
    page.wait_for_timeout(1500)
    page.screenshot(path=str(out / f"{name}.png"))
    page.set_viewport_size(VIEW)
    print("wrote", out / f"{name}.png")


def main(out: Path) -> None:
    from playwright.sync_api import sync_playwright
    from recorded import CONFIG, FILES, play, play_attached

    from ddpviz.engine.config import validate_config
    from ddpviz.workers.client import DdpvizClient
    from ddpviz.workers.store import new_run_id

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, AppStack(Path(tmp)) as stack, sync_playwright() as pw:
        client = DdpvizClient(url=stack.redis_url)
        pair = []
        for on in (True, False):  # records made here, never queued: the stack's worker must not train them
            rid = new_run_id()
            pair.append(rid)
            cfg = validate_config({**CONFIG, "mode": "ddp", "overlap": on}).to_json_dict()
            client.store.create(rid, cfg, group="overlap-pair", label=f"DDP overlap {'on' if on else 'off'}")
            play(client, rid, FILES["ddp" if on else "ddp-nooverlap"])
        rid = play_attached(client)
        browser = launch_browser(pw)
        page = browser.new_page(viewport=VIEW)
        shoot(page, out, "buckets-typical", f"{stack.url}/buckets?runs={','.join(pair)}", "Bucket timeline", 3)
        shoot(page, out, "attached-compare", f"{stack.url}/compare?runs={rid}", "Compare", 3)
        shoot(page, out, "attached-theory", f"{stack.url}/theory?runs={rid}", "Theory vs measurement", 2)
        shoot(page, out, "runs-wall", f"{stack.url}/runs", "Runs", 0)
        browser.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "screenshots")
