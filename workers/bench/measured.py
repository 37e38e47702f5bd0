"""Figures 5 (memory samples per second per device) and 6 (bucket busbw / probe busbw), computed
from a run's events.

Memory: the readings that reached the run's events. Each `memory_readings` event (the memory timer,
`engine.measure.memory_timer`) lists the timer's readings of one device (`reading_ts`); a reading
counts once, when it was taken within the training span: the first step's start (`start_ts`) to
the last step's end (`start_ts + step_time_s`), per (host, device). `memory` events' curves repeat
readings already published, and their `sampler.readings` count readings whether or not they
reached the stream, so neither counts. `ddpviz doctor` counts the same (`workers.doctor.gpu`).

Busbw: in-run bucket busbw over the probe's busbw at the same size (`engine.analysis.busbw_vs_probe`,
the probe interpolated in log size), median over the buckets that ran alone
(`engine.analysis.median_busbw_ratio`); null, saying why, without a probe or buckets.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

def training_window(events: list[dict[str, Any]]) -> tuple[float, float] | None:
    """(first step's start, last step's end) in unix seconds, or None without step events."""
    starts, ends = [], []
    for e in events:
        if e.get("type") == "step" and isinstance(e.get("start_ts"), (int, float)):
            starts.append(e["start_ts"])
            ends.append(e["start_ts"] + (e.get("step_time_s") or 0.0))
    return (min(starts), max(ends)) if starts else None


def training_span_s(events: list[dict[str, Any]]) -> float | None:
    """Seconds from the first step's start to the last step's end, or None without step events."""
    window = training_window(events)
    return window[1] - window[0] if window else None


def memory_samples_per_s(events: list[dict[str, Any]]) -> dict[str, Any]:
    """{per_device: {"host/device": readings per s}, min_per_s, span_s, samples}: the memory
    timer's readings that reached `events` (`memory_readings`), taken within the training span,
    per second of it; rates None when the run has no steps."""
    window = training_window(events)
    counts: dict[str, int] = defaultdict(int)
    for e in events:
        if e.get("type") != "memory_readings":
            continue
        name = f"{e['host']}/{e.get('device')}" if e.get("host") else str(e.get("device"))
        counts[name] += sum(1 for t in e.get("reading_ts") or ()
                            if window is None or window[0] <= t <= window[1])
    span = window[1] - window[0] if window else None
    if not span or span <= 0:
        return {"per_device": {}, "min_per_s": None, "span_s": span, "samples": dict(counts)}
    rates = {d: round(n / span, 2) for d, n in sorted(counts.items())}
    return {"per_device": rates, "min_per_s": min(rates.values(), default=None),
            "span_s": round(span, 3), "samples": dict(counts)}


def busbw_ratio(events: list[dict[str, Any]], world_size: int) -> dict[str, Any]:
    """{ratio, ratio_all, buckets_alone, buckets, reason}: median in-run bucket busbw over the
    probe's busbw at the same size, over buckets that ran alone (`ratio`) and over every bucket
    (`ratio_all`); ratio None with the reason when the probe or the buckets are missing."""
    from ddpviz.engine.analysis import busbw_vs_probe, median_busbw_ratio

    probes = [e for e in events if e.get("type") == "allreduce_probe"]
    buckets = [e for e in events if e.get("type") == "bucket"]
    if not probes:
        return {"ratio": None, "reason": "the run recorded no allreduce_probe event"}
    if not buckets:
        return {"ratio": None, "reason": "the run recorded no bucket events"}
    rows = busbw_vs_probe(buckets, probes[0]["points"], world_size)
    ratio = median_busbw_ratio(rows)
    return {"ratio": ratio, "ratio_all": median_busbw_ratio(rows, alone_only=False),
            "buckets_alone": sum(1 for r in rows if r["alone"]), "buckets": len(rows),
            "reason": None if ratio is not None else "no bucket that ran alone matched a probed size"}
