"""Figures 2 (Redis -> page latency) and 4b (time to first chart), in headless Chromium.

The app runs as `ddpviz up` runs it (`workers.up.app_command`, a Streamlit subprocess) against the
bench's Redis, and Playwright drives Debian's Chromium. Latency: a feeder appends a synthetic DDP
run's steps to its stream at a steady pace while the Live page shows the run; a MutationObserver
in the page stamps (`Date.now()`, the same host clock as Redis's entry ids) the first moment each
"step i / N" counter value appears. For step event k, latency = the first time the counter shows
k + 1 or more, minus the arrival of step k's first event (its entry id). First chart: from the
navigation to the first drawn Vega chart, per page and run size.

Needs the `playwright` package and a Chromium (`CHROMIUM`); without them the figures are null,
saying why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ddpviz.workers import keys

CHROMIUM = os.environ.get("DDPVIZ_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
APP_START_TIMEOUT_S = 90.0
CHARTS = ".vega-embed canvas, .vega-embed svg"
# Stamps each new value of the Live page's step counter ("step 12 / 80") with Date.now().
OBSERVER_JS = """
window.__steps = {};
const seen = () => {
  for (const m of document.body.innerText.matchAll(/step (\\d+) \\/ (\\d+)/g)) {
    const k = Number(m[1]);
    if (!(k in window.__steps)) window.__steps[k] = Date.now();
  }
};
document.addEventListener('DOMContentLoaded', () => {
  new MutationObserver(seen).observe(document.body, {subtree: true, childList: true, characterData: true});
});
"""


def unavailable() -> str | None:
    """Why the browser figures cannot be taken here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[dev]')"
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        return f"no Chromium at {CHROMIUM} (set DDPVIZ_CHROMIUM)"
    return None


@contextmanager
def app_server(redis_url: str, workdir: Path) -> Iterator[tuple[str, int]]:
    """The Streamlit app on a free loopback port; yields (url, pid). Stopped by its process group."""
    from ddpviz.workers.connection import free_port
    from ddpviz.workers.up import app_command, default_app_path

    port = free_port()
    log = open(workdir / "streamlit.log", "wb")
    env = {**os.environ, "REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}
    cmd = app_command(default_app_path(), "127.0.0.1", port) + ["--server.fileWatcherType", "none"]
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + APP_START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"streamlit exited with {proc.returncode}; see {workdir / 'streamlit.log'}")
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("streamlit did not answer") from None
                time.sleep(0.3)
        yield url, proc.pid
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        log.close()


def page_latencies_ms(seen_ms: dict[int, int], step_arrival_ms: dict[int, int]) -> list[float]:
    """Per step k that arrived: the first time the counter showed k + 1 or more, minus arrival.

    Args:
        seen_ms: counter value -> Date.now() ms when it first appeared.
        step_arrival_ms: step -> arrival ms of its first event in Redis.
    Steps whose counter value never appeared (the page closed first) are left out.
    """
    values = sorted(seen_ms)
    out = []
    for k, arrived in sorted(step_arrival_ms.items()):
        shown = [seen_ms[v] for v in values if v >= k + 1]
        if shown:
            out.append(float(min(shown) - arrived))
    return out


def _feed(redis, run_id: str, steps: int, interval_s: float, stop: threading.Event) -> None:
    from ddpviz.workers.bench.synthetic import step_events
    from ddpviz.workers.sink import RedisStreamWriter

    writer = RedisStreamWriter(redis, run_id)
    for s in range(steps):
        if stop.wait(interval_s):
            return
        writer.write_batch(step_events(run_id, "ddp", s, time.time()))


def _step_arrivals(redis, run_id: str) -> dict[int, int]:
    from ddpviz.workers.bench.latency import arrival_ms
    from ddpviz.workers.sink import decode_entries

    out: dict[int, int] = {}
    for entry in redis.xrange(keys.events(run_id)):
        e = decode_entries([entry])[0]
        if e.get("type") == "step":
            out.setdefault(e["step"], arrival_ms(entry[0]))
    return out


def measure_page_latency(redis, url: str, app_pid: int, steps: int, interval_s: float) -> dict[str, Any]:
    """Figure 2: feed `steps` steps every `interval_s` seconds to a run open on the Live page."""
    import psutil
    from playwright.sync_api import sync_playwright

    from ddpviz.workers.bench.latency import summarize
    from ddpviz.workers.bench.synthetic import store_open_run

    run_id = store_open_run(redis, "ddp", steps, label="feed")
    app = psutil.Process(app_pid)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.add_init_script(OBSERVER_JS)
            page.goto(f"{url}/live?runs={run_id}")
            page.get_by_text(f"step 0 / {steps}").wait_for(timeout=60_000)
            cpu0, t0 = sum(app.cpu_times()[:2]), time.monotonic()
            stop = threading.Event()
            feeder = threading.Thread(target=_feed, args=(redis, run_id, steps, interval_s, stop))
            feeder.start()
            feeder.join()
            page.get_by_text(f"step {steps} / {steps}").wait_for(timeout=30_000)
            cpu = (sum(app.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)
            seen = {int(k): int(v) for k, v in page.evaluate("window.__steps").items()}
        finally:
            browser.close()
    lat = page_latencies_ms(seen, _step_arrivals(redis, run_id))
    return {**summarize(lat), "element": "Live page step counter (status panel)",
            "feed_interval_s": interval_s, "app_cpu_share": round(cpu, 3)}


def measure_first_chart(url: str, sets: list[dict[str, Any]]) -> dict[str, Any]:
    """Figure 4b: ms from navigation to the first drawn chart, Live (DP + DDP) and Compare (the
    trio), for each stored set {events, single, dp, ddp}; a fresh browser context each time."""
    from playwright.sync_api import sync_playwright

    out: dict[str, dict[str, float]] = {"live": {}, "compare": {}}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for s in sorted(sets, key=lambda s: s["events"]):
                for page_name, ids in (("live", (s["dp"], s["ddp"])), ("compare", (s["single"], s["dp"], s["ddp"]))):
                    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
                    page = ctx.new_page()
                    t0 = time.perf_counter()
                    page.goto(f"{url}/{page_name}?runs={','.join(ids)}")
                    page.locator(CHARTS).first.wait_for(timeout=120_000)
                    out[page_name][str(s["events"])] = round((time.perf_counter() - t0) * 1e3, 1)
                    ctx.close()
        finally:
            browser.close()
    return out
