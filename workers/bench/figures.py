"""The nine figures (figure 9 in `workers.bench.attach_cost`), each a function of the bench's Redis and its `Plan` (full or quick).

Each returns a dict for the record (see `workers.bench.report`); `run_figure` turns an exception
into the figure's `error`, so one failing figure never hides the others.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ddpviz.workers.bench import latency, measured, report
from ddpviz.workers.bench.runs import DEMO_CONFIG, run_here, stream_bytes, stream_entries


@dataclass
class Plan:
    """How much each figure measures. `quick()` fits `ddpviz bench --quick` in about 2 minutes."""

    quick: bool = False
    latency_steps: int = 200  # figure 1: steps of each demo run (0.05 s apart, the demo's pace)
    flood_rate_per_s: float = 55_000.0  # figure 3: offered events/s, both ranks (10% over the target)
    flood_s: float = 30.0
    app_sizes: tuple[int, ...] = (1_000, 10_000, 100_000)  # figure 4: events per run
    first_chart_sizes: tuple[int, ...] = (1_000, 10_000, 100_000)  # figure 4: opened in Chromium
    feed_steps: int = 80  # figure 2: steps fed to the Live page
    feed_interval_s: float = 0.25
    # figure 5b: `block_steps` per turn (~0.2-0.8 s of training here); `overhead_rounds` turns of each side
    overhead_configs: list[dict[str, Any]] = field(default_factory=lambda: [
        dict(model="mlp", width=128, depth=3, global_batch_size=64, block_steps=50),
        dict(model="mlp", width=1024, depth=6, global_batch_size=64, bucket_cap_mb=5.0, block_steps=8)])
    overhead_rounds: int = 120  # 30 gave 90% intervals of +-5-8% here, too wide to judge a 3% target
    throughput_names: tuple[str, ...] = ("mlp-digits", "mlp-deep", "gpt-text")
    throughput_steps: int | None = None  # None: the configs' own
    world_sizes: tuple[int, ...] = (1, 2, 4)
    growth_runs: int = 30  # figure 8: runs stored to watch Redis grow
    keep_runs: int = 10
    attach_rounds: int = 10  # figure 9: rounds of one plain and one attached run of the example script
    attach_epochs: dict[str, int] | None = None  # figure 9: epochs per configuration (None: attach_cost.CONFIGS')
    redis_loss_rounds: int = 3  # figure 9: rounds of one attached run with Redis up, one with it stopped mid-run
    redis_loss_epochs: int = 6  # figure 9: the script's epochs in those runs

    @classmethod
    def quick_plan(cls) -> "Plan":
        return cls(quick=True, latency_steps=60, flood_s=5.0, first_chart_sizes=(1_000, 100_000),
                   feed_steps=20, feed_interval_s=0.25,
                   overhead_configs=[dict(model="mlp", width=128, depth=3, global_batch_size=64, block_steps=20)],
                   overhead_rounds=5, throughput_names=("mlp-digits",), throughput_steps=30,
                   world_sizes=(2,), growth_runs=12, keep_runs=4, attach_rounds=1,
                   attach_epochs={"real-sized": 3, "many small buckets": 5},
                   redis_loss_rounds=1, redis_loss_epochs=3)


def run_figure(key: str, fn: Callable[[], dict[str, Any]], say: Callable[[str], None]) -> dict[str, Any]:
    """fn()'s figure with `met` set by its target, or {error, traceback} if it raised."""
    say(f"figure {key}: {report.TITLES[key]} ...")
    t0 = time.time()
    try:
        fig = fn()
    except Exception as exc:  # the record says what broke; the other figures still run
        fig = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    # always the figure's own verdict over every target it states (`report.verdict`), never a `met`
    # that one of its parts brought along (figure 9's real-sized config carried its own)
    fig["met"] = report.verdict(key, fig)
    fig["wall_s"] = round(time.time() - t0, 1)
    say(f"figure {key}: done in {fig['wall_s']} s")
    return fig


# -- figures 1, 5a, 6, 8a: real demo runs through a worker's path --------------------------------

def demo_runs(redis, plan: Plan) -> dict[str, Any]:
    """A DDP and a DP run of the demo config, run here as a worker runs them; per mode the
    stream entries, run id and status."""
    out = {}
    for mode in ("ddp", "dp"):
        cfg = {**DEMO_CONFIG, "mode": mode, "steps": plan.latency_steps}
        run_id, status = run_here(redis, cfg, label=f"bench {mode}")
        out[mode] = {"run_id": run_id, "status": status, "entries": stream_entries(redis, run_id)}
    return out


def figure_1(runs: dict[str, Any]) -> dict[str, Any]:
    fig: dict[str, Any] = {"config": {**DEMO_CONFIG, "step_delay_s": "default (0.05)"}}
    for mode, r in runs.items():
        fig[mode] = {**latency.summarize(latency.step_latencies_ms(r["entries"])), "status": r["status"]}
    return fig


def figure_6(runs: dict[str, Any]) -> dict[str, Any]:
    events = [e for _, e in runs["ddp"]["entries"]]
    started = next((e for e in events if e.get("type") == "run_started"), {})
    got = measured.busbw_ratio(events, int(started.get("world_size") or 2))
    return {"backend": started.get("backend"), **got}


def memory_rate(runs: dict[str, Any]) -> dict[str, Any]:
    return {mode: measured.memory_samples_per_s([e for _, e in r["entries"]]) for mode, r in runs.items()}


def redis_per_1000_steps(redis, runs: dict[str, Any], steps: int) -> dict[str, Any]:
    ddp = runs["ddp"]
    nbytes = stream_bytes(redis, ddp["run_id"])
    return {"redis_bytes_per_1000_steps": round(nbytes / steps * 1000),
            "redis_stream_bytes": nbytes, "events": len(ddp["entries"]), "steps": steps}


# -- figure 3 -----------------------------------------------------------------------------------

def figure_3(redis, plan: Plan) -> dict[str, Any]:
    from ddpviz.workers.bench.flood import measure_flood

    return measure_flood(redis, plan.flood_rate_per_s, plan.flood_s)


# -- figure 4 and the app half of 8: synthetic sets, the app in its own process, Chromium ------

def store_sets(redis, sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    """A started single/DP/DDP set per size (started, so pages keep polling them)."""
    from ddpviz.workers.bench.synthetic import store_run
    from ddpviz.workers.store import RunStatus

    return [{"events": n, **{m: store_run(redis, m, n, group=f"bench-{n}", status=RunStatus.STARTED)
                             for m in ("single", "dp", "ddp")}} for n in sizes]


def app_paths(redis_url: str, sets: list[dict[str, Any]]) -> dict[str, Any]:
    """`python -m ddpviz.app.bench_app` on the sets (a process of its own: workers do not import app)."""
    out = subprocess.run([sys.executable, "-m", "ddpviz.app.bench_app", "--redis-url", redis_url,
                          "--sets", json.dumps(sets)], capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise RuntimeError(f"ddpviz.app.bench_app exited with {out.returncode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def figure_4(app: dict[str, Any], first_chart: dict[str, Any] | None, first_chart_reason: str | None) -> dict[str, Any]:
    sizes = sorted({int(n) for page in app["pages"].values() for n in page})
    # Growth is judged past the windows' size (10 K -> 100 K): a whole-stream read grows 10x
    # there, a windowed one not at all. From the smallest size it is reported too.
    small, big = (sizes[-2] if len(sizes) > 2 else sizes[0]), sizes[-1]
    at_largest, growth, from_smallest, ok = {}, {}, {}, []
    for page, by_size in app["pages"].items():
        o, r = by_size[str(big)]["open"], by_size[str(big)]["refresh"]
        data = lambda s, w: by_size[str(s)][w]["read_ms"] + by_size[str(s)][w]["frames_ms"]  # noqa: E731
        at_largest[page] = {"open_data_ms": round(data(big, "open"), 1),
                            "refresh_data_ms": round(data(big, "refresh"), 1),
                            "open_charts_ms": o["charts_ms"], "refresh_charts_ms": r["charts_ms"]}
        growth[page] = report.growth_exponent(data(small, "open"), data(big, "open"), small, big)
        from_smallest[page] = report.growth_exponent(data(sizes[0], "open"), data(big, "open"), sizes[0], big)
        ok.append(data(big, "open") <= 200 and data(big, "refresh") <= 200)
    worst = max((g for g in growth.values() if g is not None), default=None)
    met = all(ok) and worst is not None and worst <= 0.5
    return {"largest": big, "at_largest": at_largest, "growth_exponent": worst,
            "growth_span": [small, big], "growth_by_page": growth,
            "growth_from_smallest_by_page": from_smallest, "pages": app["pages"], "first_chart_ms": first_chart,
            "first_chart_reason": first_chart_reason, "met": met}


# -- figure 5 -----------------------------------------------------------------------------------

def figure_5(memory: dict[str, Any], plan: Plan) -> dict[str, Any]:
    from ddpviz.workers.bench.overhead import emit_cost, gil_reading_cost_us, measure_overhead, recorded_events

    rates = [m for m in memory.values() if m.get("min_per_s") is not None]
    slowest = min(rates, key=lambda m: m["min_per_s"]) if rates else {}
    overhead = []
    for cfg in plan.overhead_configs:
        got = measure_overhead({**cfg, "world_size": 2}, plan.overhead_rounds)
        target = report.overhead_target(cfg)
        ratio = got.get("ratio")
        overhead.append({**got, "config": {**got.get("config", {}), **cfg}, "target": target,
                         "met": None if ratio is None or target is None else ratio <= target})
    return {"memory_samples_per_s": {"min_per_s": slowest.get("min_per_s"), "by_mode": memory},
            "overhead": overhead, "emit": emit_cost(recorded_events()), "gil_reading_us": gil_reading_cost_us()}


# -- figure 7 -----------------------------------------------------------------------------------

def figure_7(plan: Plan, say: Callable[[str], None]) -> dict[str, Any]:
    from ddpviz.workers.bench.throughput import measure_throughput

    return measure_throughput(list(plan.throughput_names), plan.throughput_steps,
                              list(plan.world_sizes), say)


# -- figure 8: Redis growth with the number of runs, without and with retention -----------------

def redis_growth(redis_url: str, plan: Plan, events_per_run: int) -> dict[str, Any]:
    """Stores `plan.growth_runs` synthetic DDP runs of `events_per_run` events in a database of
    its own, twice: without retention, then applying keep_runs after each (as workers do)."""
    from ddpviz.workers.bench.synthetic import store_run
    from ddpviz.workers.connection import connect
    from ddpviz.workers.retention import RetentionPolicy, apply_retention

    r = connect(redis_url.rsplit("/", 1)[0] + "/3")
    out: dict[str, Any] = {"runs": plan.growth_runs, "keep_runs": plan.keep_runs,
                           "events_per_run": events_per_run}
    for name, policy in (("none", RetentionPolicy(0, 0)), ("keep", RetentionPolicy(plan.keep_runs, 0))):
        r.flushdb()
        base = r.info("memory")["used_memory"]
        used = []
        for _ in range(plan.growth_runs):
            store_run(r, "ddp", events_per_run)
            apply_retention(r, policy)
            used.append(r.info("memory")["used_memory"] - base)
        out[name] = [round(u / 2 ** 20, 2) for u in used]
    r.flushdb()
    none = out["none"]
    out["bytes_per_run_no_retention"] = round((none[-1] - none[0]) / max(1, len(none) - 1) * 2 ** 20)
    out["with_retention_mib"] = out["keep"][-1]
    return out


def figure_8(per_1000: dict[str, Any], app: dict[str, Any] | None, growth: dict[str, Any]) -> dict[str, Any]:
    return {**per_1000, "app_rss_mib": (app or {}).get("rss_largest_open_mib"),
            "app_rss_after_imports_mib": (app or {}).get("rss_after_imports_mib"),
            "app_events": (app or {}).get("largest_events"), "redis_growth": growth}


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def tmpdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="ddpviz-bench-"))
