"""The default DP/DDP pair, tried as a user would, N times:
``.venv/bin/python tests/app/default_pair_tries.py [N] [--cli] [--busy] [--out FILE]``.

App (the default): starts the stack (embedded Redis, one worker, Streamlit), and each try opens the
Launch page in headless Chromium, clicks "Launch DP and DDP" (the primary button) with every
default, follows "Watch them live" and keeps the Live page open until both runs have finished.
It records the verdict (`engine.verdict`, from the runs' own summaries, as every page shows it),
the Live page's verdict sentence, and what the app itself cost meanwhile: CPU seconds of the
Streamlit server and of Chromium's processes per second of the pair's training (psutil, sampled
every `SAMPLE_S`; a process that ends loses at most its last interval).

`--cli`: each try is `ddpviz compare --modes dp,ddp --json` with every default, its `verdict`.
`--busy`: one busy background process (``python -c "while True: pass"``) runs through the tries.

Each try records the load average before and after (`os.getloadavg`). A try is ok when DDP is
ahead with the interval's low end above `LOW_END` (issue 33.3). Writes the record as JSON (default
docs/bench/default-pair-tries.json) and, for the app, the last try's Live page,
docs/screenshots/default-pair-live.png.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from stack import ROOT, AppStack, launch_browser  # noqa: E402

OUT_JSON = ROOT / "docs" / "bench" / "default-pair-tries.json"
OUT_PNG = ROOT / "docs" / "screenshots" / "default-pair-live.png"
DONE = ("succeeded", "failed", "canceled", "lost")
LOW_END = 1.05  # DDP ahead beyond noise: the interval's low end above this
SAMPLE_S = 1.0


class CpuMeter:
    """CPU seconds (user + system) of a changing set of processes, summed over the ones seen."""

    def __init__(self, pick):
        self.pick, self.first, self.last = pick, {}, {}

    def sample(self) -> None:
        for p in self.pick():
            try:
                t = p.cpu_times()
            except Exception:  # ended between listing and reading
                continue
            key = (p.pid, p.create_time())
            self.first.setdefault(key, t.user + t.system)
            self.last[key] = t.user + t.system

    def seconds(self) -> float:
        return sum(self.last[k] - self.first[k] for k in self.last)


def app_processes(stack) -> dict:
    """Pickers of the Streamlit server and of Chromium's processes (children of this process)."""
    import psutil

    server = psutil.Process(stack._procs[1].pid)  # AppStack starts the worker, then Streamlit

    def chromium():
        return [p for p in psutil.Process().children(recursive=True)
                if any(s in (p.name() or "") for s in ("chrom", "headless"))]
    return {"streamlit": lambda: [server], "chromium": chromium}


def pair_verdict(summaries: dict) -> dict | None:
    from ddpviz.engine.verdict import verdict

    v = verdict(summaries.get("dp"), summaries.get("ddp"))
    return None if v is None else {k: v.to_json()[k] for k in ("winner", "ratio", "interval", "steps", "text")}


def judged(v: dict | None) -> bool:
    return bool(v and v["winner"] == "ddp" and v["interval"][0] > LOW_END)


def one_app_try(stack, client, browser, k: int) -> dict:
    before = {r["run_id"] for r in client.list_runs(limit=1000)}
    meters = {name: CpuMeter(pick) for name, pick in app_processes(stack).items()}
    load0 = os.getloadavg()
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    page.goto(stack.url)
    page.get_by_role("heading", name="Launch a run").wait_for(timeout=60_000)
    page.get_by_role("button", name="Launch DP and DDP", exact=True).click()
    page.get_by_role("link", name="Watch them live").click()
    page.get_by_role("heading", name="Live").wait_for(timeout=60_000)
    t0, deadline = time.monotonic(), time.monotonic() + 900
    for m in meters.values():
        m.sample()
    while True:
        runs = [r for r in client.list_runs(limit=1000) if r["run_id"] not in before]
        if len(runs) == 2 and all(r.get("status") in DONE for r in runs):
            break
        assert time.monotonic() < deadline, "the default pair did not finish in 15 minutes"
        time.sleep(SAMPLE_S)
        for m in meters.values():
            m.sample()
    wall = time.monotonic() - t0
    cost = {name: m.seconds() / wall for name, m in meters.items()}
    page.wait_for_timeout(6000)  # a few refreshes after the end
    text = page.inner_text("body")
    summaries = {}
    for r in runs:
        rec = client.get_run(r["run_id"]) or {}
        summaries[(rec.get("config") or {}).get("mode")] = rec.get("summary") or {}
    said = ("DDP is ahead", "DP is ahead here", "DP and DDP are level")
    sentence = next((line.strip() for line in text.splitlines() if any(s in line for s in said)), None)
    OUT_PNG.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(OUT_PNG), full_page=True)  # each try's replaces the last
    page.close()
    v = pair_verdict(summaries)
    return dict(try_=k + 1, verdict=v, live_sentence=sentence and sentence[:240], ok=judged(v),
                samples_per_s={m: s.get("samples_per_s") for m, s in summaries.items()},
                val_accuracy={m: s.get("val_accuracy") for m, s in summaries.items()},
                app_cpu_s_per_s=cost, training_wall_s=wall, load_before=load0, load_after=os.getloadavg())


def one_cli_try(k: int) -> dict:
    load0, t0 = os.getloadavg(), time.monotonic()
    out = subprocess.run([str(Path(sys.executable).parent / "ddpviz"), "compare", "--modes", "dp,ddp", "--json"],
                         capture_output=True, text=True, cwd=ROOT, timeout=900)
    wall = time.monotonic() - t0
    if out.returncode != 0:
        return dict(try_=k + 1, ok=False, error=out.stderr[-2000:], load_before=load0, load_after=os.getloadavg())
    report = json.loads(out.stdout)
    v = report["verdict"] and {k2: report["verdict"][k2] for k2 in ("winner", "ratio", "interval", "steps", "text")}
    return dict(try_=k + 1, verdict=v, ok=judged(v), wall_s=wall,
                samples_per_s={m: report[m]["samples_per_s"] for m in ("dp", "ddp")},
                val_accuracy={m: report[m]["val_accuracy"] for m in ("dp", "ddp")},
                load_before=load0, load_after=os.getloadavg())


def run_tries(n: int, cli: bool) -> list[dict]:
    tries = []
    if cli:
        for k in range(n):
            tries.append(one_cli_try(k))
            print(json.dumps(tries[-1]), flush=True)
        return tries
    from playwright.sync_api import sync_playwright

    from ddpviz.workers.client import DdpvizClient

    with tempfile.TemporaryDirectory() as tmp, AppStack(Path(tmp)) as stack, sync_playwright() as pw:
        client = DdpvizClient(url=stack.redis_url)
        browser = launch_browser(pw)
        try:
            for k in range(n):
                tries.append(one_app_try(stack, client, browser, k))
                print(json.dumps(tries[-1]), flush=True)
        finally:
            browser.close()
    return tries


def main(argv: list[str]) -> None:
    import argparse

    from ddpviz.engine.config import RunConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("n", nargs="?", type=int, default=3)
    ap.add_argument("--cli", action="store_true")
    ap.add_argument("--busy", action="store_true")
    ap.add_argument("--out", type=Path, default=OUT_JSON)
    args = ap.parse_args(argv)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    try:
        tries = run_tries(args.n, args.cli)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    record = dict(date=time.strftime("%Y-%m-%d %H:%M"), cpu_count=os.cpu_count(),
                  path="ddpviz compare --modes dp,ddp --json" if args.cli else "app: Launch DP and DDP, Live open",
                  busy_background_process=args.busy, config=RunConfig().to_json_dict(), low_end_target=LOW_END,
                  tries=tries, all_ok=all(t["ok"] for t in tries))
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
