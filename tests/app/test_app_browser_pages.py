"""Every analysis page in headless Chromium, on real runs made by a real worker.

One stack for the module (embedded Redis with an append-only file, one `ddpviz worker`,
Streamlit): a world-size sweep of [2] launched from the Sweeps page (single, DP ×2, DDP ×2 of one
config: the Compare set) and one DDP run with overlap off. Each test opens one page and checks
that its charts are drawn, with no exception on the page. The last test stops Redis and starts
it again under the Cluster page, which must show the outage banner and then recover.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from stack import CHROMIUM, AppStack, launch_browser

pytestmark = [pytest.mark.browser, pytest.mark.slow]

RUNS_TIMEOUT_S = 300  # worker start, 4 runs (2 of them spawn rank processes) on a 2-core box
STEPS = "8"
CHARTS = ".vega-embed canvas, .vega-embed svg"


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    from ddpviz.workers.client import DdpvizClient

    tmp = tmp_path_factory.mktemp("browser-pages")
    with AppStack(tmp, persist=True) as stack, sync_api.sync_playwright() as pw:
        browser = launch_browser(pw)
        page = browser.new_page(viewport={"width": 1500, "height": 1400},
                                accept_downloads=True)
        client = DdpvizClient(url=stack.redis_url)
        try:
            runs = _launch_sweep_from_page(page, stack, client)
            off = client.submit({**runs["ddp"]["config"], "overlap": False},
                                label="DDP overlap off")
            _wait_finished(client, [r["run_id"] for r in runs.values()] + [off], stack)
            yield {"stack": stack, "page": page, "client": client, "off": off,
                   "ids": {m: r["run_id"] for m, r in runs.items()}}
        finally:
            browser.close()


def _fill(page, field: str, value: str) -> None:
    box = page.locator(f'input[aria-label="{field}"]')
    box.fill(value)
    box.press("Tab")  # Streamlit commits a number input on blur


def _launch_sweep_from_page(page, stack, client) -> dict[str, dict]:
    page.goto(f"{stack.url}/sweeps")
    page.get_by_role("heading", name="Sweeps").wait_for(timeout=30_000)
    _fill(page, "values (comma-separated)", "2")
    _fill(page, "steps", STEPS)
    _fill(page, "width", "256")
    _fill(page, "bucket_cap_mb", "0.1")  # several buckets after the rebuild
    page.get_by_role("button", name="Launch sweep").click()
    deadline = time.monotonic() + 30
    while len(client.list_runs()) < 3:
        assert time.monotonic() < deadline, "the sweep did not reach Redis"
        time.sleep(0.3)
    runs = {r["config"]["mode"]: r for r in client.list_runs()}
    assert set(runs) == {"single", "dp", "ddp"} and len({r["group"] for r in runs.values()}) == 1
    assert {r["config"]["steps"] for r in runs.values()} == {int(STEPS)}
    return runs


def _wait_finished(client, ids: list[str], stack) -> None:
    deadline = time.monotonic() + RUNS_TIMEOUT_S
    while True:
        status = {i: client.get_run(i)["status"] for i in ids}
        if all(s in ("succeeded", "failed", "canceled", "lost") for s in status.values()):
            break
        assert time.monotonic() < deadline, f"runs too slow: {status}\n{stack.log('worker')}"
        time.sleep(0.5)
    assert set(status.values()) == {"succeeded"}, f"{status}\n{stack.log('worker')}"


def _visit(session, path: str, heading: str, charts: int) -> object:
    """Open `path`, wait for its heading and `charts` drawn charts; no exception, no banner."""
    page = session["page"]
    page.goto(f"{session['stack'].url}/{path}")
    page.get_by_role("heading", name=heading).wait_for(timeout=30_000)
    try:
        page.locator(CHARTS).nth(charts - 1).wait_for(timeout=45_000) if charts else None
    except Exception:
        page.screenshot(path=str(Path(session["stack"].workdir) / "fail.png"), full_page=True)
        raise
    page.wait_for_timeout(500)
    assert page.locator('[data-testid="stException"]').count() == 0
    assert page.get_by_text("is unreachable").count() == 0
    return page


def test_compare_page(session):
    page = _visit(session, "compare", "Compare", charts=6)
    # waited for, not counted at once: under 3 xdist workers (2026-12-06) the count read 0 once right after the
    # six charts were up, and 1 alone; a page that redraws (live_body reruns it when the set's last run ends) is
    # the likely cause, not proven. The text must still appear, once
    page.get_by_text("single: peak memory", exact=True).wait_for(timeout=30_000)
    assert page.get_by_text("single: peak memory", exact=True).count() == 1
    assert page.locator('[data-testid="stTable"]').count() == 1  # cells wrap: no value cut
    cell = page.get_by_text("rebuilt each step; as computed with: yes", exact=True)
    assert cell.count() == 1 and cell.bounding_box()["width"] > 0


def test_bucket_timeline_overlap_on_and_off(session):
    ids = f"{session['ids']['ddp']},{session['off']}"
    page = _visit(session, f"buckets?runs={ids}", "Bucket timeline", charts=3)
    # step 0 is memory-traced (its button says "instrumented"); the page opens on a typical step
    page.get_by_text(re.compile(r"^step 0( \(instrumented\))?$")).first.click()
    page.wait_for_timeout(1500)
    assert page.locator(CHARTS).count() >= 3
    assert page.locator('[data-testid="stException"]').count() == 0
    assert page.get_by_text("Step 0, before the rebuild").count() == 1


def test_dp_timeline_page(session):
    page = _visit(session, "dp_timeline", "DP timeline", charts=2)
    assert page.get_by_text("idle").count() >= 1


def test_theory_page(session):
    page = _visit(session, "theory", "Theory vs measurement", charts=3)
    assert page.get_by_text("measured after training").count() == 1  # the all-reduce probe
    assert page.get_by_text("overlapped another bucket").count() == 1


def test_learn_page(session):
    _visit(session, "learn", "Learn: the star, the ring and the shards", charts=2)


def test_sweeps_page(session):
    page = _visit(session, "sweeps", "Sweeps", charts=2)
    assert page.locator('[data-testid="stDataFrame"]').count() == 1  # the sweep's runs
    assert page.get_by_text("still queued or running").count() == 0


def test_runs_page_export_and_delete(session, tmp_path):
    client, off = session["client"], session["off"]
    page = _visit(session, "runs", "Runs", charts=0)
    grid = page.locator('[data-testid="stDataFrame"]')
    grid.wait_for(timeout=30_000)
    box = grid.bounding_box()
    newest_row_y = box["y"] + 35 + 17  # header, then the newest run (the overlap-off DDP run)
    page.mouse.click(box["x"] + 18, newest_row_y)
    page.get_by_role("button", name="Events (JSONL)").wait_for(timeout=30_000)
    with page.expect_download() as info:
        page.get_by_role("button", name="Events (JSONL)").click()
    path = tmp_path / "run.jsonl"
    info.value.save_as(path)
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert events[0]["type"] == "run_started" and events[-1]["type"] == "run_finished"
    assert {e["run_id"] for e in events} == {off}
    with page.expect_download() as info:
        page.get_by_role("button", name="Chrome trace (Perfetto)").click()
    info.value.save_as(tmp_path / "trace.json")
    trace = json.loads((tmp_path / "trace.json").read_text())
    tracks = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert len(tracks) == 2  # one per rank (its steps and buckets are threads in it)
    # a re-run lands on top of the table: the tick stays on the run it was on (Streamlit keeps row positions, and
    # the next run down was ticked instead, Delete included: a new user, 2026-12-06)
    before = {r["run_id"] for r in client.list_runs()}
    page.get_by_role("button", name="Re-run 1").click()
    deadline = time.monotonic() + 20
    while not (new := {r["run_id"] for r in client.list_runs()} - before):
        assert time.monotonic() < deadline, "the re-run was not submitted"
        time.sleep(0.3)
    (again,) = new
    client.cancel(again)  # its training is not this test's: the page's rows are
    page.get_by_text(f"Export {off}").wait_for(timeout=30_000)
    page.wait_for_timeout(1000)
    assert page.get_by_text(f"Export {off}").count() == 1
    assert page.get_by_text(re.compile(r"^Export [0-9a-f]{16}$")).count() == 1
    page.get_by_role("button", name="Delete 1").click()
    page.get_by_role("button", name="Delete", exact=True).click()
    deadline = time.monotonic() + 20
    while client.get_run(off) is not None:
        assert time.monotonic() < deadline, "the run was not deleted"
        time.sleep(0.3)
    assert client.get_run(again) is not None  # the re-run, on top and unticked, is kept
    while client.get_run(again)["status"] not in ("canceled", "succeeded", "failed"):
        assert time.monotonic() < deadline + 60, "the re-run did not end"
        time.sleep(0.3)
    assert page.locator('[data-testid="stException"]').count() == 0


def test_cluster_page_rides_out_a_redis_outage(session):
    stack = session["stack"]
    page = _visit(session, "cluster", "Cluster", charts=1)
    assert page.get_by_text("CPU only").count() >= 1
    stack.stop_redis()
    try:
        page.get_by_text("is unreachable — retrying").first.wait_for(timeout=30_000)
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        stack.start_redis()
    page.get_by_text("is unreachable — retrying").first.wait_for(state="detached", timeout=30_000)
    page.locator(CHARTS).first.wait_for(timeout=30_000)  # the runs-per-worker chart is back
    assert page.locator('[data-testid="stException"]').count() == 0
