"""`ddpviz bench`: measure the nine figures and write them as JSON plus a Markdown table.

One command makes the whole record: ``ddpviz bench --out docs/bench/cpu-2core.json`` writes the
JSON there and the table next to it (``cpu-2core.md``). ``--quick`` measures less (shorter runs
and flood, one overhead round, one throughput config) to finish in about two minutes.
Everything runs here against a private embedded Redis (never ``$REDIS_URL``: the flood writes
hundreds of MB), with the app in a subprocess and Chromium driven by Playwright when present.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ddpviz.workers.bench import figures as F
from ddpviz.workers.bench import report

ALL = ("1", "2", "3", "4", "5", "6", "7", "8", "9")


def _say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def run_bench(plan: F.Plan, only: tuple[str, ...] = ALL) -> dict[str, Any]:
    """Measure the figures in `only`; returns the record (see `workers.bench.report`)."""
    from ddpviz.workers.bench.runs import bench_heartbeat
    from ddpviz.workers.connection import EmbeddedRedis, connect

    t0 = time.time()
    record: dict[str, Any] = {"machine": report.machine(), "quick": plan.quick,
                              "load_avg_1m": {"start": report.load_avg()}, "figures": {}}
    figs = record["figures"]
    work = F.tmpdir()
    server = EmbeddedRedis(work / "redis", persist=False).start()
    try:
        redis = connect(server.url)
        bench_heartbeat(redis)
        runs: dict[str, Any] = {}
        if {"1", "5", "6", "8"} & set(only):
            _say(f"demo runs (DDP and DP, {plan.latency_steps} steps each) ...")
            runs = F.demo_runs(redis, plan)
        if "1" in only:
            figs["1"] = F.run_figure("1", lambda: F.figure_1(runs), _say)
        if "3" in only:
            figs["3"] = F.run_figure("3", lambda: F.figure_3(redis, plan), _say)
        app: dict[str, Any] | None = None
        if {"2", "4", "8"} & set(only):
            app = _app_figures(redis, server.url, plan, only, figs, work)
        if "5" in only:
            figs["5"] = F.run_figure("5", lambda: F.figure_5(F.memory_rate(runs), plan), _say)
        if "6" in only:
            figs["6"] = F.run_figure("6", lambda: F.figure_6(runs), _say)
        if "7" in only:
            figs["7"] = F.run_figure("7", lambda: F.figure_7(plan, _say), _say)
        if "8" in only:
            events = len(runs["ddp"]["entries"]) if runs else 3600
            figs["8"] = F.run_figure("8", lambda: F.figure_8(
                F.redis_per_1000_steps(redis, runs, plan.latency_steps), app,
                F.redis_growth(server.url, plan, events)), _say)
        if "9" in only:
            from ddpviz.workers.bench.attach_cost import measure_attach_figure

            _say(f"attach cost: {plan.attach_rounds} rounds of the example script per configuration, "
                 "plain and attached ...")
            from ddpviz.workers.bench.attach_redis_loss import measure_redis_loss

            figs["9"] = F.run_figure("9", lambda: {
                **measure_attach_figure(redis, server.url, work, plan.attach_rounds, plan.attach_epochs),
                "redis_lost": measure_redis_loss(work, plan.redis_loss_rounds, plan.redis_loss_epochs)}, _say)
    finally:
        server.stop()
    record["figures"] = {k: figs[k] for k in ALL if k in figs}
    record["load_avg_1m"]["end"] = report.load_avg()
    record["duration_s"] = round(time.time() - t0)
    return record


def _app_figures(redis, url: str, plan: F.Plan, only, figs: dict, work: Path) -> dict[str, Any] | None:
    """Figures 2 and 4 (and the app's memory for 8): synthetic sets, the app process, Chromium."""
    from ddpviz.workers.bench import browser

    _say(f"storing synthetic runs of {', '.join(f'{n:,}' for n in plan.app_sizes)} events ...")
    sets = F.store_sets(redis, plan.app_sizes)
    app, app_error = None, None
    try:
        app = F.app_paths(url, sets)
    except Exception as exc:
        app_error = f"{type(exc).__name__}: {exc}"
    why_not = browser.unavailable()
    first_chart = None
    if {"2", "4"} & set(only) and why_not is None:
        with browser.app_server(url, work) as (app_url, pid):
            if "2" in only:
                figs["2"] = F.run_figure("2", lambda: browser.measure_page_latency(
                    redis, app_url, pid, plan.feed_steps, plan.feed_interval_s), _say)
            if "4" in only:
                try:
                    first_chart = browser.measure_first_chart(
                        app_url, [s for s in sets if s["events"] in plan.first_chart_sizes])
                except Exception as exc:
                    why_not = f"{type(exc).__name__}: {exc}"
    elif "2" in only:
        figs["2"] = {"reason": why_not, "met": None}
    if "4" in only:
        figs["4"] = F.run_figure("4", lambda: F.figure_4(app, first_chart, why_not) if app else
                                 {"error": app_error}, _say)
    return app


def cmd_overhead(plan: "F.Plan", rounds: int | None, out: str | None) -> int:
    """`ddpviz bench --overhead`: instrumented / plain DDP step time on the plan's overhead
    configs (`engine.harness.overhead`), each against its target; JSON to stdout or `out`."""
    from ddpviz.workers.bench.overhead import measure_overhead

    rows = []
    for cfg in plan.overhead_configs:
        _say(f"overhead: {cfg} ...")
        got = measure_overhead({**cfg, "world_size": 2}, rounds or plan.overhead_rounds)
        target = report.overhead_target(cfg)
        rows.append({**got, "target": target, "met": None if target is None else got["ratio"] <= target})
        lo, hi = got["ratio_interval_90"]
        _say(f"  ddpviz / plain = {got['ratio']:.3f} (90% interval {lo:.3f}-{hi:.3f}; target <= {target}); "
             f"rounds: " + ", ".join(f"{r['ratio']:.3f}" for r in got["rounds"]))
    text = json.dumps({"overhead": rows}, indent=2, default=str)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
        _say(f"wrote {out}")
    else:
        print(text)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    plan = F.Plan.quick_plan() if args.quick else F.Plan()
    if args.rounds is not None and args.rounds < 1:
        _say(f"refused: --rounds must be >= 1 (got {args.rounds})")
        return 2
    if args.overhead:
        return cmd_overhead(plan, args.rounds, args.out)
    if args.bucket_cost:
        from ddpviz.workers.bench.bucket_cost import measure_bucket_cost

        text = json.dumps(measure_bucket_cost(args.rounds or 5, say=_say), indent=1, default=str)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(text + "\n")
            _say(f"wrote {args.out}")
        else:
            print(text)
        return 0
    if args.rounds:
        plan.overhead_rounds = args.rounds
    if args.only:  # throughput configs (figure 7), as before
        plan.throughput_names = tuple(args.only)
    record = run_bench(plan, tuple(args.figures or ALL))
    text = json.dumps(record, indent=2, default=str)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
        md = Path(args.md) if args.md else out.with_suffix(".md")
        md.write_text(report.markdown(record))
        _say(f"wrote {out} and {md}")
    else:
        print(text)
        if args.md:
            Path(args.md).write_text(report.markdown(record))
    sys.stderr.write(report.markdown(record))
    return 0 if all(not f.get("error") for f in record["figures"].values()) else 1


def register(command) -> None:
    """Add `bench` to the `ddpviz` parser (`command` as in workers.cli.commands.build_parser)."""
    from ddpviz.workers.bench.throughput import BENCH_CONFIGS

    p = command("bench", cmd_bench, "measure ddpviz's nine performance figures; JSON + Markdown",
                redis=False)
    p.add_argument("--quick", action="store_true", help="shorter runs and flood (about 2 minutes)")
    p.add_argument("--overhead", action="store_true",
                   help="only the instrument's overhead: ddpviz DDP / plain torch DDP step time, "
                        "taking turns block by block (engine.harness.overhead)")
    p.add_argument("--bucket-cost", action="store_true",
                   help="only the host time ddpviz adds per DDP bucket per step (25 MB vs 0.01 MB caps) and per "
                        "small step against a plain run alone, for bucket_timing hook and recorder "
                        "(workers/bench/bucket_cost.py)")
    p.add_argument("--rounds", type=int, metavar="N", help="rounds (one block of each side) of the overhead "
                   "measurement (--overhead and figure 5; default 120, --quick 5)")
    p.add_argument("--out", metavar="FILE.json", help="write the JSON here and the Markdown table "
                   "next to it (FILE.md); default: JSON to stdout")
    p.add_argument("--md", metavar="FILE.md", help="write the Markdown table here instead")
    p.add_argument("--figures", nargs="*", choices=ALL, metavar="N",
                   help="measure only these figures (1-9; default all)")
    p.add_argument("--only", nargs="*", choices=list(BENCH_CONFIGS),
                   help="figure 7: these throughput configs only")
