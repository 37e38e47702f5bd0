"""Figures 5 (memory samples per second per device) and 6 (bucket busbw / probe busbw), computed
from a run's events.

Memory: a `memory` event from the timed sampler (`engine.measure.memory_sampler`) carries
`sampler.readings`, the timer's readings of that device since the previous `memory` event, and
counts as that many; other `memory` events are one sample of one device, unless they carry a list
of samples in one of `SAMPLE_LIST_FIELDS` (a within-step curve), which then counts as that many. The rate is
samples over the training span: the first step's start (`start_ts`) to the last step's end
(`start_ts + step_time_s`), per (host, device).

Busbw: in-run bucket busbw over the probe's busbw at the same size (`engine.analysis.busbw_vs_probe`,
the probe interpolated in log size), median over the buckets that ran alone
(`engine.analysis.median_busbw_ratio`); null, saying why, without a probe or buckets.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

SAMPLE_LIST_FIELDS = ("samples", "curve")


def training_span_s(events: list[dict[str, Any]]) -> float | None:
    """Seconds from the first step's start to the last step's end, or None without step events."""
    starts, ends = [], []
    for e in events:
        if e.get("type") == "step" and isinstance(e.get("start_ts"), (int, float)):
            starts.append(e["start_ts"])
            ends.append(e["start_ts"] + (e.get("step_time_s") or 0.0))
    return (max(ends) - min(starts)) if starts else None


def memory_samples_per_s(events: list[dict[str, Any]]) -> dict[str, Any]:
    """{per_device: {"host/device": samples per s}, min_per_s, span_s, samples}; rates None
    when the run has no steps."""
    counts: dict[str, int] = defaultdict(int)
    for e in events:
        if e.get("type") != "memory":
            continue
        name = f"{e['host']}/{e.get('device')}" if e.get("host") else str(e.get("device"))
        readings = (e.get("sampler") or {}).get("readings") if isinstance(e.get("sampler"), dict) else None
        listed = [e[f] for f in SAMPLE_LIST_FIELDS if isinstance(e.get(f), list)]
        counts[name] += readings if isinstance(readings, int) else len(listed[0]) if listed else 1
    span = training_span_s(events)
    if not span or span <= 0:
        return {"per_device": {}, "min_per_s": None, "span_s": span, "samples": dict(counts)}
    rates = {d: round(n / span, 2) for d, n in sorted(counts.items())}
    return {"per_device": rates, "min_per_s": min(rates.values(), default=None),
            "span_s": round(span, 3), "samples": dict(counts)}


def busbw_ratio(events: list[dict[str, Any]], world_size: int) -> dict[str, Any]:
    """{ratio, ratio_all, buckets_alone, buckets, reason}: median in-run bucket busbw over the
    probe's busbw at the same size, over buckets that ran alone (`ratio`) and over every bucket
    (`ratio_all`); ratio None with the reason when the probe or the buckets are missing."""
    from engine.analysis import busbw_vs_probe, median_busbw_ratio

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
