"""The bench's record: machine facts, each figure against its target, JSON and a Markdown table.

Targets are issue 10's (and issue 9's for figure 5). A figure's `met` is True only when every
target it states was measured and met, False when any of them was missed, and None where there is
no target (figures 7 and 8, figure 6 on gloo) or a target could not be judged (its `reason` or
`error` says why). `verdict` is the only source of a figure's `met`.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import platform
import socket
from typing import Any

TARGETS = {
    "1": "p95 <= 150 ms, DDP and DP",
    "2": "p95 <= 1.0 s",
    "3": ">= 50,000 events/s sustained for 30 s (backlog under 1 s all along), zero loss",
    "4": "<= 200 ms read + frames at 100 K events (open and refresh), growth well below linear "
         "(exponent <= 0.5 from 10 K to 100 K)",
    "5": ">= 10 memory samples/s per device; instrumented / plain DDP <= 1.10 (mlp 128x3) and "
         "<= 1.03 (mlp 1024x6)",
    "6": ">= 0.9 on NCCL (gloo: reported)",
    "7": "reported (no target)",
    "8": "reported (no target); Redis flat with retention",
    "9": "attached / plain median iteration time <= 1.03, by the script's own clock; Redis stopped mid-run: "
         "wall time <= 1.10x, every step kept",
}
TITLES = {
    "1": "Event latency, rank to Redis",
    "2": "Event latency, Redis to the page",
    "3": "Publish throughput",
    "4": "App data path",
    "5": "Memory sampling rate; instrumentation overhead",
    "6": "Bucket busbw / probe busbw",
    "7": "samples/s and scaling efficiency",
    "8": "Footprint",
    "9": "Attach cost (`ddpviz run -- torchrun ...`)",
}
MAX_BACKLOG_MS = 1000  # figure 3: the most an event may trail its emit (one second of events)
OVERHEAD_TARGETS = {("mlp", 128, 3): 1.10, ("mlp", 1024, 6): 1.03}


def machine() -> dict[str, Any]:
    """Host, CPUs, memory, Python, torch, CUDA and the load average when asked."""
    import psutil
    import torch

    model = ""
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), "")
    except OSError:
        model = platform.processor()
    return {"host": socket.gethostname(), "cpu_count": os.cpu_count(), "cpu_model": model,
            "memory_gib": round(psutil.virtual_memory().total / 2 ** 30, 1),
            "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "cuda": torch.cuda.is_available(),
            "date": dt.datetime.now().astimezone().isoformat(timespec="seconds")}


def load_avg() -> float:
    return round(os.getloadavg()[0], 2)


def growth_exponent(t_small: float | None, t_large: float | None, n_small: int, n_large: int) -> float | None:
    """k in t ∝ n^k between two sizes (1 = linear, 0 = flat); None without both times."""
    if not t_small or not t_large or n_large <= n_small:
        return None
    return round(math.log(t_large / t_small) / math.log(n_large / n_small), 3)


def _all(*conds: bool | None) -> bool | None:
    """False if any target was missed, else None if any could not be judged, else True."""
    if any(c is False for c in conds):
        return False
    if any(c is None for c in conds):
        return None
    return all(conds)


def verdict(key: str, fig: dict[str, Any]) -> bool | None:
    """Whether figure `key` meets its target (None: no target, or not measured)."""
    if fig.get("error") or fig.get("reason"):
        return None
    if key == "1":
        p95 = [fig.get(m, {}).get("p95_ms") for m in ("ddp", "dp")]
        return _all(*(None if p is None else p <= 150 for p in p95))
    if key == "2":
        p = fig.get("p95_ms")
        return None if p is None else p <= 1000
    if key == "3":
        ok = fig.get("lost") == 0 and fig.get("duplicated") == 0 and fig.get("foreign") == 0
        # sustained = delivered at >= 50 K/s over the whole 30 s with the backlog (arrival - emit)
        # never past MAX_BACKLOG_MS: a path that cannot keep up sees the lag grow all run. The
        # slowest whole second is reported, not judged: 20 ms batches make it jitter +-25%.
        lag = (fig.get("lag_ms") or {}).get("max")
        return (ok and fig.get("delivered_per_s", 0) >= 50_000 and fig.get("duration_s", 0) >= 30
                and lag is not None and lag <= MAX_BACKLOG_MS)
    if key == "4":
        return fig.get("met")
    if key == "5":
        rate = (fig.get("memory_samples_per_s") or {}).get("min_per_s")
        ratios = [o.get("met") for o in fig.get("overhead", [])]
        return _all(None if rate is None else rate >= 10, *ratios) if ratios else None
    if key == "9":
        ratio, lost = fig.get("ratio"), fig.get("redis_lost")
        cost = None if ratio is None else ratio <= fig.get("target", 1.03)
        return _all(cost, lost.get("met")) if lost is not None else cost
    if key == "6":
        ratio, backend = fig.get("ratio"), fig.get("backend")
        return None if ratio is None or backend != "nccl" else ratio >= 0.9
    return None


def overhead_target(config: dict[str, Any]) -> float | None:
    return OVERHEAD_TARGETS.get((config.get("model"), config.get("width"), config.get("depth")))


def _num(x: Any, fmt: str) -> str:
    """`x` formatted with `fmt`, or a dash when it is not a number."""
    return format(x, fmt) if isinstance(x, (int, float)) else "—"


def _ms(x: Any) -> str:
    return "—" if x is None else f"{x:,.0f} ms" if x >= 10 else f"{x:.1f} ms"


def _summary(key: str, f: dict[str, Any]) -> str:
    """One cell saying what was measured."""
    if f.get("error"):
        return f"error: {f['error']}"
    if f.get("reason"):
        return f"not measured: {f['reason']}"
    if key == "1":
        return "; ".join(f"{m.upper()} p50 {_ms(f[m]['p50_ms'])}, p95 {_ms(f[m]['p95_ms'])}, max "
                         f"{_ms(f[m]['max_ms'])} (n={f[m]['n']})" for m in ("ddp", "dp") if m in f)
    if key == "2":
        return (f"p50 {_ms(f['p50_ms'])}, p95 {_ms(f['p95_ms'])}, max {_ms(f['max_ms'])} (n={f['n']}, "
                f"{f['element']}); app CPU {f.get('app_cpu_share', 0):.0%} of a core while it ran")
    if key == "3":
        lag = f.get("lag_ms") or {}
        return (f"{f['delivered_per_s']:,}/s delivered, backlog p99 {_ms(lag.get('p99'))} / max "
                f"{_ms(lag.get('max'))}, slowest second {f['sustained_min_per_s']:,}/s, "
                f"offered {f['offered_per_s']:,.0f}/s for {f['duration_s']:g} s; {f['emitted']:,} "
                f"emitted, {f['lost']} lost, {f['duplicated']} duplicated; drain {f['drain_s']} s")
    if key == "4":
        big = f.get("largest")
        cells = [f"{p} {_ms(v.get('open_data_ms'))} open / {_ms(v.get('refresh_data_ms'))} refresh "
                 f"(+charts {_ms(v.get('open_charts_ms'))})" for p, v in (f.get("at_largest") or {}).items()]
        fc = f.get("first_chart_ms") or {}
        first = "; first chart in Chromium: " + ", ".join(
            f"{p} {_ms(v.get(str(big)))}" for p, v in fc.items()) if fc else ""
        span = f.get("growth_span") or ["?", big]
        return (f"at {big:,} events: " + "; ".join(cells) + f"; growth exponent "
                f"{f.get('growth_exponent')} ({span[0]:,} to {span[1]:,} events)" + first)
    if key == "5":
        rate = f.get("memory_samples_per_s") or {}
        parts = [f"memory: {rate.get('min_per_s')} samples/s per device (slowest device)"]
        for o in f.get("overhead", []):
            c = o.get("config", {})
            parts.append(f"overhead {c.get('model')} {c.get('width')}x{c.get('depth')}: "
                         f"{_num(o.get('ratio'), '.3f')}x (target {o.get('target')})")
        return "; ".join(parts)
    if key == "6":
        return f"{_num(f.get('ratio'), '.2f')} on {f.get('backend')}"
    if key == "7":
        pts = (f.get("scaling") or {}).get("points", [])
        eff = ", ".join(f"{p['mode']} n={p['world_size']}{' (oversubscribed)' if p['oversubscribed'] else ''}"
                        f" {p['efficiency']}" for p in pts)
        rows = {(r["name"], r["mode"]): r["samples_per_s"] for r in f.get("results", [])}
        names = dict.fromkeys(n for n, _ in rows)
        sps = "; ".join(f"{n}: " + " / ".join(f"{rows.get((n, m)) or 0:,.0f}" for m in ("single", "dp", "ddp"))
                        for n in names)
        return f"samples/s single / DP / DDP: {sps}; scaling efficiency: {eff}"
    if key == "8":
        g = f.get("redis_growth") or {}
        return (f"Redis {f.get('redis_bytes_per_1000_steps', 0) / 2 ** 20:.2f} MiB per 1,000 steps "
                f"(2-rank DDP); app {f.get('app_rss_mib')} MiB after opening a "
                f"{f.get('app_events', 0):,}-event run ({f.get('app_rss_after_imports_mib')} MiB at "
                f"start); Redis +{g.get('bytes_per_run_no_retention', 0) / 2 ** 20:.2f} MiB per run "
                f"without retention, {g.get('with_retention_mib')} MiB after {g.get('runs')} runs with "
                f"keep_runs={g.get('keep_runs')}")
    if key == "9":
        parts = [(name, c) for name, c in (f.get("configs") or {"": f}).items()]
        return "; ".join(
            (f"{name}: " if name else "")
            + f"{_num(c.get('ratio'), '.3f')}x: median {_num(c.get('attached_median_ms'), '.2f')} ms attached, "
            f"{_num(c.get('plain_median_ms'), '.2f')} ms plain ({c.get('n_attached')} / {c.get('n_plain')} "
            f"printed times, {c.get('rounds')} rounds taking turns; per round "
            + ", ".join(f"{r:.3f}" for r in c.get("ratio_per_round", [])) + f"); {c.get('script')} "
            f"--hidden {c.get('hidden')} --bucket-cap-mb {c.get('bucket_cap_mb', 0.25)}, 2 ranks on {c.get('backend')}"
            for name, c in parts) + (f" (judged: {f['judged']})" if f.get("judged") else "") + _redis_lost(f)
    return ""


def _redis_lost(f: dict[str, Any]) -> str:
    r = f.get("redis_lost")
    if not r:
        return ""
    if r.get("reason"):
        return f"; Redis stopped mid-run: not measured ({r['reason']})"
    return (f"; Redis stopped mid-run: median wall {_num(r.get('median_wall_stopped_s'), '.2f')} s vs "
            f"{_num(r.get('median_wall_up_s'), '.2f')} s with Redis up, {_num(r.get('ratio'), '.3f')}x "
            f"(target <= {r.get('target')}), every step kept after upload: {r.get('every_step_kept')}")


def markdown(record: dict[str, Any]) -> str:
    """The Markdown table of a bench record."""
    m = record["machine"]
    load = record.get("load_avg_1m", {})
    lines = [f"# ddpviz bench — {m['host']}", "",
             f"{m['date']} · {m['cpu_count']} CPUs ({m['cpu_model']}) · {m['memory_gib']} GiB · "
             f"Python {m['python']} · torch {m['torch']} · CUDA {m['cuda']} · "
             f"`ddpviz bench{' --quick' if record.get('quick') else ''}` in {record.get('duration_s')} s · "
             f"load average {load.get('start')} at start, {load.get('end')} at the end"
             + (" (**busy machine: timings are noisy**)" if max(load.values() or [0]) > (m['cpu_count'] or 1)
                else ""), "",
             "| # | figure | measured | target | met |", "|---|---|---|---|---|"]
    for key, fig in record["figures"].items():
        met = fig.get("met")
        lines.append(f"| {key} | {TITLES[key]} | {_summary(key, fig)} | {TARGETS[key]} | "
                     f"{'—' if met is None else 'met' if met else '**not met**'} |")
    lines += ["", "Each figure's details, and how it is measured, are in the JSON next to this file "
              "and in `workers/bench/` (see its module docstrings)."]
    return "\n".join(lines) + "\n"
