"""The default Launch pair, tried as a user would, N times:
``.venv/bin/python tests/app/default_pair_tries.py [N]``.

Starts the stack (embedded Redis, one worker, Streamlit), and each try opens the Launch page in
headless Chromium, clicks "Launch DP and DDP" (the default action) with every default, follows
"Watch them live" and keeps the Live page open until both runs have finished. Then it reads DP's
and DDP's samples/s from the runs' own summaries and the Live page's text: either DDP is ahead,
or the page must say in one sentence why DP is ahead or level here ("DP is ahead here ...",
"DP and DDP are level here ..."). Writes docs/bench/default-pair-tries.json and the last try's
Live page, docs/screenshots/default-pair-live.png.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from stack import ROOT, AppStack, launch_browser  # noqa: E402

OUT_JSON = ROOT / "docs" / "bench" / "default-pair-tries.json"
OUT_PNG = ROOT / "docs" / "screenshots" / "default-pair-live.png"
DONE = ("succeeded", "failed", "canceled", "lost")


def step_medians(client, run_id: str) -> dict:
    """Median samples/s of the run's `step` events: every step of every rank (what the Live page's
    metric takes), and per rank."""
    import statistics

    events, after = [], "0-0"
    while True:
        batch, after = client.read_events(run_id, after, count=5000)
        if not batch:
            break
        events += batch
    steps = [e for e in events if e.get("type") == "step"]
    ranks = sorted({e.get("rank", 0) for e in steps})
    return dict(live_median_samples_per_s=statistics.median(e["samples_per_s"] for e in steps) if steps else None,
                by_rank_median_samples_per_s={r: statistics.median(e["samples_per_s"] for e in steps
                                                                   if e.get("rank", 0) == r) for r in ranks})


def one_try(stack, client, browser, k: int) -> dict:
    before = {r["run_id"] for r in client.list_runs(limit=1000)}
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    page.goto(stack.url)
    page.get_by_role("heading", name="Launch a run").wait_for(timeout=60_000)
    page.get_by_role("button", name="Launch DP and DDP", exact=True).click()
    page.get_by_role("link", name="Watch them live").click()
    page.get_by_role("heading", name="Live").wait_for(timeout=60_000)
    deadline = time.monotonic() + 900
    while True:
        runs = [r for r in client.list_runs(limit=1000) if r["run_id"] not in before]
        if runs and all(r.get("status") in DONE for r in runs):
            break
        assert time.monotonic() < deadline, "the default set did not finish in 15 minutes"
        time.sleep(2)
    page.wait_for_timeout(6000)  # a few refreshes after the end
    text = page.inner_text("body")
    by_mode = {}
    for r in runs:
        rec = client.get_run(r["run_id"]) or {}
        mode = (rec.get("config") or {}).get("mode")
        by_mode[mode] = dict(run_id=r["run_id"], status=rec.get("status"),
                             samples_per_s=(rec.get("summary") or {}).get("samples_per_s"),
                             **step_medians(client, r["run_id"]))
    dp, ddp = (by_mode.get("dp") or {}).get("samples_per_s"), (by_mode.get("ddp") or {}).get("samples_per_s")
    said = ("DP is ahead here", "DP and DDP are level here")
    sentence = next((line.strip() for line in text.splitlines() if any(s in line for s in said)), None)
    OUT_PNG.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(OUT_PNG), full_page=True)  # each try's replaces the last
    page.close()
    ok = bool(dp and ddp and (ddp > dp or sentence))
    return dict(try_=k + 1, runs=by_mode, ddp_over_dp=(ddp / dp) if dp and ddp else None,
                ddp_ahead=bool(dp and ddp and ddp > dp), dp_ahead_sentence=sentence, ok=ok,
                load_average_after=os.getloadavg()[0])


def main(n: int) -> None:
    from playwright.sync_api import sync_playwright

    from ddpviz.workers.client import DdpvizClient

    tries = []
    with tempfile.TemporaryDirectory() as tmp, AppStack(Path(tmp)) as stack, sync_playwright() as pw:
        client = DdpvizClient(url=stack.redis_url)
        browser = launch_browser(pw)
        try:
            for k in range(n):
                t = one_try(stack, client, browser, k)
                tries.append(t)
                print(json.dumps(t), flush=True)
        finally:
            browser.close()
    OUT_JSON.write_text(json.dumps(dict(date=time.strftime("%Y-%m-%d"), cpu_count=os.cpu_count(),
                                        tries=tries, all_ok=all(t["ok"] for t in tries)), indent=2) + "\n")
    print("wrote", OUT_JSON, "and", OUT_PNG)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
