"""Screenshots of every page with real runs: ``.venv/bin/python tests/app/screenshots.py``.

Starts the stack (embedded Redis, one worker, Streamlit), submits a single/DP/DDP/FSDP set of one
config (a small CNN on the digits, whose backward is long enough on CPU for bucket overlap to
show), DDP with overlap on and off, a DDP run that fails on purpose (fault=raise on rank 1) and
a world-size sweep (2 and 4 devices, plus FSDP on 4), and writes docs/screenshots/<page>.png:
launch, launch-error, live-running, live, live-fsdp, live-failed, runs, compare, buckets,
dp-timeline, theory, learn, sweeps, cluster. The browser shows a blank page while the later runs train, so it does
not compete with them for the CPU.

On a small CPU box run it as ``OMP_NUM_THREADS=1 .venv/bin/python tests/app/screenshots.py``:
the single-device baseline otherwise uses every core for intra-op threads and, with anything
else running, slows down many times over (DP and DDP ranks already use cores / world_size).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from stack import ROOT, AppStack, launch_browser  # noqa: E402

OUT = ROOT / "docs" / "screenshots"
CONFIG = {"world_size": 2, "steps": 40, "model": "cnn", "width": 64, "depth": 3,
          "bucket_cap_mb": 0.05, "step_delay_s": 0.02, "eval_every": 0}
SWEEP = {**CONFIG, "steps": 25, "step_delay_s": 0.0}
VIEW = {"width": 1500, "height": 1000}
MAX_HEIGHT = 4000
TERMINAL = ("succeeded", "failed", "canceled", "lost")


def _settle(page, charts: int = 0, timeout_s: float = 60) -> None:
    """Wait for `charts` drawn Vega charts, then a moment for fonts and layout."""
    if charts:
        page.locator(".vega-embed canvas, .vega-embed svg").nth(charts - 1).wait_for(
            timeout=timeout_s * 1000)
    page.wait_for_timeout(1500)


def shoot(page, name: str, height: int | None = None) -> None:
    """Streamlit scrolls inside its own container, so the viewport is made as tall as the page
    (measured, unless `height` is given)."""
    if height is None:
        height = page.evaluate("() => document.querySelector('[data-testid=\"stMain\"]')"
                               ".scrollHeight") + 40
    page.set_viewport_size({"width": VIEW["width"], "height": min(MAX_HEIGHT, height)})
    page.wait_for_timeout(1500)
    page.screenshot(path=str(OUT / f"{name}.png"))
    page.set_viewport_size(VIEW)
    print("wrote", OUT / f"{name}.png")


def wait(client, ids, timeout_s: float = 300, until=TERMINAL) -> None:
    deadline = time.monotonic() + timeout_s
    while any(client.get_run(i)["status"] not in until for i in ids):
        assert time.monotonic() < deadline, "runs too slow"
        time.sleep(0.5)


def visit(page, url: str, heading: str, charts: int, name: str) -> None:
    page.goto(url)
    page.get_by_role("heading", name=heading).wait_for()
    _settle(page, charts=charts)
    shoot(page, name)


def main() -> None:
    from playwright.sync_api import sync_playwright

    from ddpviz.workers.client import DdpvizClient
    from ddpviz.workers.sweeps import submit_sweep, submit_trio, sweep_runs

    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, AppStack(Path(tmp)) as stack, \
            sync_playwright() as pw:
        browser = launch_browser(pw)
        page = browser.new_page(viewport=VIEW)
        url = stack.url
        page.goto(url)
        page.get_by_role("heading", name="Launch a run").wait_for()
        _settle(page)
        shoot(page, "launch", 1150)
        box = page.locator('input[aria-label="world_size"]')
        box.fill("0")
        box.press("Tab")
        page.get_by_role("button", name="Launch DP and DDP", exact=True).click()
        page.get_by_text("Not launched").wait_for()
        _settle(page)
        shoot(page, "launch-error", 1300)

        client = DdpvizClient(url=stack.redis_url)
        _, ids = submit_trio(client, CONFIG)
        page.goto(f"{url}/live?runs={ids['dp']},{ids['ddp']}")
        page.get_by_role("heading", name="Live").wait_for()
        wait(client, [ids["single"], ids["dp"]])
        wait(client, [ids["ddp"]], until=("started",) + TERMINAL)
        time.sleep(4)  # DDP ranks spawned and stepping
        _settle(page, charts=3)
        shoot(page, "live-running")
        wait(client, [ids["ddp"]])
        time.sleep(3)
        _settle(page, charts=6)
        shoot(page, "live")
        page.goto(f"{url}/live?runs={ids['ddp']},{ids['fsdp']}")
        page.get_by_role("heading", name="Live").wait_for()
        wait(client, [ids["fsdp"]])
        time.sleep(3)
        _settle(page, charts=8)
        shoot(page, "live-fsdp")
        page.goto("about:blank")  # nothing polls while the next runs train
        # the hook on both sides, as the Buckets page's on/off button asks: every step's all-reduce timed
        overlap = submit_sweep(client, {**CONFIG, "bucket_timing": "hook"}, "overlap", [True, False])
        pair = [r["run_id"] for r in sweep_runs(client, overlap)]
        bad = client.submit({**CONFIG, "mode": "ddp", "steps": 20, "fault": "raise",
                             "fault_rank": 1, "fault_step": 5}, label="DDP, rank 1 raises")
        sweep = submit_sweep(client, SWEEP, "world_size", [2, 4])
        fsdp4 = client.submit({**SWEEP, "mode": "fsdp", "world_size": 4}, label="FSDP ×4", group=sweep)
        wait(client, pair + [bad], timeout_s=600)
        page.goto(f"{url}/live?runs={bad}")
        page.get_by_text("Run failed").wait_for()
        _settle(page, charts=2)
        shoot(page, "live-failed", 1600)

        trio = ",".join(ids.values())
        visit(page, f"{url}/compare?runs={trio}", "Compare", 6, "compare")
        visit(page, f"{url}/buckets?runs={','.join(pair)}", "Bucket timeline", 3, "buckets")
        visit(page, f"{url}/dp_timeline?runs={ids['dp']}", "DP timeline", 2, "dp-timeline")
        visit(page, f"{url}/theory?runs={ids['dp']},{ids['ddp']}", "Theory vs measurement", 3,
              "theory")
        page.goto("about:blank")
        swept = sweep_runs(client, sweep)
        wait(client, [r["run_id"] for r in swept], timeout_s=600)
        wait(client, [fsdp4], timeout_s=600)
        four = ",".join(r["run_id"] for r in swept if r["config"]["world_size"] == 4
                        and r["config"]["mode"] != "single")
        visit(page, f"{url}/learn?runs={four},{fsdp4}", "Learn: the star, the ring and the shards", 3,
              "learn")
        visit(page, f"{url}/sweeps", "Sweeps", 2, "sweeps")
        visit(page, f"{url}/runs", "Runs", 0, "runs")
        grid = page.locator('[data-testid="stDataFrame"]').bounding_box()
        page.mouse.click(grid["x"] + 18, grid["y"] + 35 + 17)  # select the newest run
        page.get_by_role("button", name="Events (JSONL)").wait_for()
        _settle(page)
        shoot(page, "runs-selected")
        visit(page, f"{url}/cluster", "Cluster", 1, "cluster")
        browser.close()


if __name__ == "__main__":
    main()
