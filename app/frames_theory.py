"""Pure transforms for the Theory page: per-bucket bandwidth and the fitted ring cost model.

Formulas are `engine.analysis`'s (algbw = bytes / time, busbw = algbw · 2(n−1)/n as in
nccl-tests; ring all-reduce time t = a + c·bytes fitted by least squares). GB/s = 1e9 bytes/s.

A bucket's time is its *service* time: collectives on one process group run one after another
(one NCCL stream, one gloo pair per peer), so a bucket launched while the previous one was still
running only starts being served when that one ends. Counting from its launch instead would
charge it the wait as well (`serialised`).
"""

from __future__ import annotations

from typing import Any, Iterable

import pandas as pd

from app import frames
from engine.analysis import bucket_bandwidths, fit_ring_model, predict_ring_s

Event = dict[str, Any]
MAX_SCATTER = 4000  # bucket points drawn at most (the newest kept)


def serialised(events: Iterable[Event]) -> list[Event]:
    """Bucket events with `comm_start_s` moved to max(launch, previous bucket's end) per
    (step, rank), in launch order."""
    by: dict[tuple[int, int], list[Event]] = {}
    for e in frames.of_type(events, "bucket"):
        if e.get("comm_start_s") is not None and e.get("comm_end_s") is not None:
            by.setdefault((e["step"], e.get("rank", 0)), []).append(e)
    out = []
    for key in sorted(by):
        prev_end = float("-inf")
        for e in sorted(by[key], key=lambda b: b["comm_start_s"]):
            start = max(e["comm_start_s"], min(prev_end, e["comm_end_s"]))
            out.append({**e, "comm_start_s": start})
            prev_end = max(prev_end, e["comm_end_s"])
    return out


def bandwidth_frame(events: Iterable[Event], world_size: int) -> pd.DataFrame:
    """One row per bucket all-reduce: step, rank, bucket_index, nbytes, kib, comm_ms,
    algbw_gbps, busbw_gbps (newest `MAX_SCATTER` rows)."""
    cols = ["step", "rank", "bucket_index", "nbytes", "kib", "comm_ms", "algbw_gbps", "busbw_gbps"]
    evs = serialised(events)
    if not evs:
        return pd.DataFrame(columns=cols)
    rows = [{"step": b["step"], "rank": int(b.get("rank", 0)), "bucket_index": b["bucket_index"],
             "nbytes": b["nbytes"], "kib": b["nbytes"] / 1024, "comm_ms": b["comm_s"] * 1000.0,
             "algbw_gbps": (b["algbw_bytes_per_s"] or float("nan")) / 1e9,
             "busbw_gbps": (b["busbw_bytes_per_s"] or float("nan")) / 1e9}
            for b in bucket_bandwidths(evs[-MAX_SCATTER:], world_size)]
    return pd.DataFrame(rows, columns=cols)


def per_bucket(bw: pd.DataFrame) -> pd.DataFrame:
    """Median algbw and busbw per bucket index over ranks and steps ≥ 1 (step 0 has one big
    bucket before the rebuild): long form with columns bucket, kib, which, gbps."""
    cols = ["bucket", "kib", "which", "gbps"]
    late = bw[bw["step"] >= 1] if (bw["step"] >= 1).any() else bw
    if late.empty:
        return pd.DataFrame(columns=cols)
    med = late.groupby("bucket_index", as_index=False).agg(
        kib=("kib", "median"), algbw=("algbw_gbps", "median"), busbw=("busbw_gbps", "median"))
    long = med.melt(id_vars=["bucket_index", "kib"], value_vars=["algbw", "busbw"],
                    var_name="which", value_name="gbps")
    return long.rename(columns={"bucket_index": "bucket"})[cols]


def ring_fit(events: Iterable[Event], world_size: int) -> tuple[dict[str, float] | None, pd.DataFrame]:
    """Fit the ring model to the kept buckets (steps ≥ 1 when they span two sizes, else all).

    Returns (model or None, line) where line has columns nbytes, kib, predicted_ms over
    [0, largest bucket] (empty when the fit is undetermined: fewer than two bucket sizes).
    """
    evs = serialised(events)
    late = [e for e in evs if e["step"] >= 1]
    use = late if len({e["nbytes"] for e in late}) >= 2 else evs
    model = fit_ring_model(use, world_size) if use else None
    if model is None:
        return None, pd.DataFrame(columns=["nbytes", "kib", "predicted_ms"])
    top = max(e["nbytes"] for e in use)
    xs = [top * i / 20 for i in range(21)]
    line = pd.DataFrame({"nbytes": xs, "kib": [x / 1024 for x in xs],
                         "predicted_ms": [predict_ring_s(model, int(x)) * 1000.0 for x in xs]})
    return model, line


def describe_fit(model: dict[str, float], world_size: int) -> str:
    """One sentence with the fitted latency and bandwidth, in ms and GB/s (or why the fit says
    nothing: time not growing with size means noise or waiting dominate)."""
    if model["s_per_byte"] <= 0:
        return (f"the fitted line does not grow with bucket size (slope "
                f"{model['s_per_byte'] * 1e9:.3f} ns/B): here all-reduce time is dominated by "
                "waiting for the other rank and by noise, not by bytes, so no bandwidth can be "
                "read from it; larger buckets (a wider model) make bytes dominate")
    beta = model["beta_bytes_per_s"]
    bw = "∞" if beta == float("inf") else f"{beta / 1e9:.3f} GB/s"
    return (f"t(bytes) = {model['latency_s'] * 1000:.3f} ms + bytes × "
            f"{model['s_per_byte'] * 1e9:.3f} ns/B — per-hop latency α = "
            f"{model['alpha_s'] * 1e6:.1f} µs over 2(n−1) = {2 * (world_size - 1)} hops, link "
            f"bandwidth β = {bw}")
