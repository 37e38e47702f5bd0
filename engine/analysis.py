"""Measures derived from a run's events: bandwidths, the ring cost model, theory bytes.

Pure Python (no torch), so the app and the CLI can use it. Formulas:

- algbw = bytes / time; busbw = algbw * 2(n-1)/n for all-reduce — the bus bandwidth of NCCL's
  performance notes (nccl-tests, doc/PERFORMANCE.md), comparable to the link's peak.
- ring all-reduce time (Patarasuk & Yuan 2009; Thakur et al. 2005): t(b) = 2(n-1)·α + 2(n-1)/n · b/β,
  i.e. t = a + b·c; `fit_ring_model` fits (a, c) by least squares to the run's own buckets and
  reports α = a / 2(n-1) (per-hop latency, s) and β = 2(n-1)/n / c (link bandwidth, bytes/s).
- bytes per step (README, "How the numbers are made"): DP device 0 sends and receives (n-1)·P, every other device P;
  ring all-reduce sends and receives 2(n-1)/n · P per rank.
"""

from __future__ import annotations

from typing import Any, Iterable


def ring_factor(n: int) -> float:
    """2(n-1)/n: bytes each rank sends (and receives) per byte all-reduced in a ring."""
    return 2 * (n - 1) / n if n > 0 else 0.0


def bucket_bandwidths(buckets: Iterable[dict[str, Any]], world_size: int) -> list[dict[str, Any]]:
    """Each bucket event with `comm_s`, `algbw_bytes_per_s` and `busbw_bytes_per_s` added."""
    out = []
    for b in buckets:
        comm = (b.get("comm_end_s") or 0) - (b.get("comm_start_s") or 0)
        alg = b["nbytes"] / comm if comm > 0 else None
        out.append({**b, "comm_s": comm, "algbw_bytes_per_s": alg,
                    "busbw_bytes_per_s": alg * ring_factor(world_size) if alg else None})
    return out


def fit_ring_model(buckets: Iterable[dict[str, Any]], world_size: int) -> dict[str, float] | None:
    """Least-squares fit of t = a + c·bytes over the buckets' all-reduce times.

    Returns ``{latency_s: a, s_per_byte: c, alpha_s, beta_bytes_per_s}`` or None when there are fewer
    than two distinct bucket sizes (the line is then undetermined).
    """
    pts = [(b["nbytes"], b["comm_end_s"] - b["comm_start_s"]) for b in buckets
           if b.get("comm_end_s") is not None and b.get("comm_start_s") is not None]
    if len({x for x, _ in pts}) < 2:
        return None
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    c = sum((x - mx) * (y - my) for x, y in pts) / sxx
    a = my - c * mx
    hops = 2 * (world_size - 1)
    return dict(latency_s=a, s_per_byte=c, alpha_s=a / hops if hops else 0.0,
                beta_bytes_per_s=ring_factor(world_size) / c if c > 0 else float("inf"))


def predict_ring_s(model: dict[str, float], nbytes: int) -> float:
    """All-reduce time the fitted model predicts for `nbytes`."""
    return model["latency_s"] + model["s_per_byte"] * nbytes


def theory_bytes(mode: str, world_size: int, param_bytes: int) -> dict[int, int]:
    """Bytes each device sends (= receives) per step for the parameters/gradients, by device index."""
    n = world_size
    if mode == "dp":
        return {i: (n - 1) * param_bytes if i == 0 else param_bytes for i in range(n)}
    if mode == "ddp":
        return {i: int(ring_factor(n) * param_bytes) for i in range(n)}
    return {0: 0}
