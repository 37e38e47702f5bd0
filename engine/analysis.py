"""Measures derived from a run's events: bandwidths, the ring cost model, theory bytes.

Pure Python (no torch), so the app and the CLI can use it. Formulas:

- algbw = bytes / time; busbw = algbw * 2(n-1)/n for all-reduce — the bus bandwidth of NCCL's
  performance notes (nccl-tests, doc/PERFORMANCE.md), comparable to the link's peak.
- ring all-reduce time (Patarasuk & Yuan 2009; Thakur et al. 2005): t(b) = 2(n-1)·α + 2(n-1)/n · b/β,
  i.e. t = a + c·b; `fit_ring_times` fits (a, c) by least squares on *relative* error and
  reports α = a / 2(n-1) (per-hop latency, s) and β = 2(n-1)/n / c (link bandwidth, bytes/s).
- the all-reduce probe (engine/modes/ddp/probe.py) gives one (bytes, time) point per message size
  (`probe_point`); `probe_fit` fits the ring model to the widest range of sizes one line holds.
- bytes per step (README, "How the numbers are made"): DP device 0 sends and receives (n-1)·P, every other device P;
  ring all-reduce sends and receives 2(n-1)/n · P per rank.

A bucket all-reduce "ran alone" when no other bucket's all-reduce on the same rank and step was
in flight during any part of it (`mark_alone`). gloo runs two collectives of one process group
at once (ProcessGroupGloo's `Options::threads` defaults to 2 worker threads pulling from one
queue, torch/csrc/distributed/c10d/ProcessGroupGloo.cpp), so two buckets in flight share the
link and CPU, and neither's duration is a bandwidth measurement; only buckets that ran alone feed
the bandwidth fit.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Iterable

Event = dict[str, Any]


def ring_factor(n: int) -> float:
    """2(n-1)/n: bytes each rank sends (and receives) per byte all-reduced in a ring."""
    return 2 * (n - 1) / n if n > 0 else 0.0


def bucket_bandwidths(buckets: Iterable[Event], world_size: int) -> list[Event]:
    """Each bucket event with `comm_s` (its all-reduce's end minus start, else its measured
    `comm_duration_s`: the GPU duration NCCL's flight recorder gives with no span), `algbw_bytes_per_s`
    and `busbw_bytes_per_s` added. The ring fit's callers pass only spans (`mark_alone`)."""
    out = []
    for b in buckets:
        comm = comm_seconds(b)
        alg = b["nbytes"] / comm if comm > 0 else None
        out.append({**b, "comm_s": comm, "algbw_bytes_per_s": alg,
                    "busbw_bytes_per_s": alg * ring_factor(world_size) if alg else None})
    return out


def comm_seconds(b: Event) -> float:
    """A bucket's all-reduce time (s): `comm_end_s` - `comm_start_s` where both were measured, else its
    `comm_duration_s` (a duration measured without a position), else 0 (none measured)."""
    if _timed(b):
        return b["comm_end_s"] - b["comm_start_s"]
    return b.get("comm_duration_s") or 0.0


def _timed(b: Event) -> bool:
    return b.get("comm_start_s") is not None and b.get("comm_end_s") is not None


def mark_alone(buckets: Iterable[Event]) -> list[Event]:
    """Bucket events that carry both all-reduce times, each with `alone` added.

    `alone` is False when another bucket of the same (step, rank) has an all-reduce interval
    [comm_start_s, comm_end_s] that shares time with this one — max(starts) < min(ends); two
    intervals that only touch (one ends as the other starts) ran one after the other. Events
    without both times are left out (nothing to judge). Order is kept.
    """
    timed = [b for b in buckets if _timed(b)]
    groups: dict[tuple[Any, Any], list[int]] = {}
    for i, b in enumerate(timed):
        groups.setdefault((b.get("step"), b.get("rank", 0)), []).append(i)
    alone = [True] * len(timed)
    for idx in groups.values():
        for x, i in enumerate(idx):
            for j in idx[x + 1:]:
                bi, bj = timed[i], timed[j]
                if max(bi["comm_start_s"], bj["comm_start_s"]) < min(bi["comm_end_s"], bj["comm_end_s"]):
                    alone[i] = alone[j] = False
    return [{**b, "alone": a} for b, a in zip(timed, alone)]


def fit_ring_times(points: Iterable[tuple[float, float]], world_size: int) -> Event | None:
    """Fit t = a + c·bytes to ``(nbytes, time_s)`` pairs, minimising relative error.

    Weighted least squares with weights 1/t² (each point's residual counts as a fraction of its
    own time). Why not plain least squares: probe sizes span four decades (4 KiB..64 MiB), and a
    1% wobble of the largest time is larger than the whole latency, so plain least squares lets
    the largest sizes set `a` (often negative) and ignores the small ones; timing noise is about
    proportional to the time, which relative error treats evenly. The fit is constrained to
    a ≥ 0 and c ≥ 0 (time cannot be negative at zero bytes nor fall as bytes grow): when the free
    solution breaks one, the best fit on that boundary is returned (the two-variable
    non-negative least-squares solution).

    Returns ``{latency_s: a, s_per_byte: c, alpha_s: a / 2(n-1), beta_bytes_per_s:
    2(n-1)/n / c (inf when c == 0), points_used: the distinct sizes used (bytes, ascending),
    n_points: pairs used}``, or None with fewer than two distinct
    sizes among points with time > 0 (the line is then undetermined).
    """
    pts = [(float(x), float(t)) for x, t in points if t is not None and t > 0]
    if len({x for x, _ in pts}) < 2:
        return None
    a, c = _nnls_line(pts)
    hops = 2 * (world_size - 1)
    return dict(latency_s=a, s_per_byte=c, alpha_s=a / hops if hops else 0.0,
                beta_bytes_per_s=ring_factor(world_size) / c if c > 0 else math.inf,
                points_used=sorted({int(x) for x, _ in pts}), n_points=len(pts))


def _nnls_line(pts: list[tuple[float, float]]) -> tuple[float, float]:
    """(a, c) ≥ 0 minimising Σ ((t − a − c·x) / t)²: the free solution if it is non-negative,
    else the better of the two boundary fits (a = 0, or c = 0)."""
    scale = max(x for x, _ in pts)  # sizes in units of the largest, for a well-conditioned solve
    xs, ts = [x / scale for x, _ in pts], [t for _, t in pts]
    w = [1.0 / (t * t) for t in ts]
    sw, sx, sy = sum(w), sum(wi * x for wi, x in zip(w, xs)), sum(wi * t for wi, t in zip(w, ts))
    sxx = sum(wi * x * x for wi, x in zip(w, xs))
    sxy = sum(wi * x * t for wi, x, t in zip(w, xs, ts))
    det = sw * sxx - sx * sx
    a, c = (sxx * sy - sx * sxy) / det, (sw * sxy - sx * sy) / det
    if a < 0 or c < 0:
        def err(ab: tuple[float, float]) -> float:
            return sum(((t - ab[0] - ab[1] * x) / t) ** 2 for x, t in zip(xs, ts))
        a, c = min([(0.0, max(0.0, sxy / sxx)), (max(0.0, sy / sw), 0.0)], key=err)
    return a, c / scale


FIT_TOLERANCE = 0.2  # a probe fit's range: every size in it predicted within this fraction
FIT_MIN_SIZES = 3  # ... and at least this many sizes (a line through two points always fits)


def rel_residual(model: Event, nbytes: float, time_s: float) -> float:
    """(predicted − measured) / measured for one point."""
    return (predict_ring_s(model, nbytes) - time_s) / time_s


def has_bandwidth_signal(fit: Event | None, largest_nbytes: float,
                         tolerance: float = FIT_TOLERANCE) -> bool:
    """Whether a fitted line says anything about bandwidth: its byte term at the largest size,
    c·bytes, is more than `tolerance` of the time it predicts there. Below that, the growth of
    time with size is within the noise the fit tolerates, and β = 2(n−1)/n / c would be a number
    read from noise (on a latency plateau c is 0 or nearly so: β infinite or absurd)."""
    if fit is None or not fit["s_per_byte"] > 0:
        return False
    byte_term = fit["s_per_byte"] * largest_nbytes
    return byte_term > tolerance * (fit["latency_s"] + byte_term)


def fit_ring_theil_sen(points: Iterable[tuple[float, float]], world_size: int) -> Event | None:
    """t = a + c·bytes by Theil-Sen: c = the median of the slopes between every two sizes,
    a = the median of t − c·bytes, each clamped at 0 (Sen 1968, "Estimates of the regression
    coefficient based on Kendall's tau"). A third of the points can be wild without moving it,
    where least squares follows every outlier. Same dict as `fit_ring_times`; None with fewer than
    two distinct sizes."""
    pts = sorted((float(x), float(t)) for x, t in points if t is not None and t > 0)
    slopes = [(tj - ti) / (xj - xi) for k, (xi, ti) in enumerate(pts) for xj, tj in pts[k + 1:] if xj > xi]
    if not slopes:
        return None
    c = max(0.0, statistics.median(slopes))
    a = max(0.0, statistics.median(t - c * x for x, t in pts))
    hops = 2 * (world_size - 1)
    return dict(latency_s=a, s_per_byte=c, alpha_s=a / hops if hops else 0.0,
                beta_bytes_per_s=ring_factor(world_size) / c if c > 0 else math.inf,
                points_used=sorted({int(x) for x, _ in pts}), n_points=len(pts))


def fit_ring_range(points: Iterable[tuple[float, float]], world_size: int,
                   tolerance: float = FIT_TOLERANCE, min_sizes: int = FIT_MIN_SIZES) -> Event | None:
    """`fit_ring_times` over the widest contiguous range of sizes that one line describes.

    For one time per size (a probe: sizes ascending), every contiguous range of at least
    `min_sizes` sizes is fitted; a range qualifies when its line predicts each of its points
    within `tolerance` (relative) and its time grows with size beyond that tolerance
    (`has_bandwidth_signal`: a flat latency plateau says nothing of β, and before this rule a
    wide plateau of small sizes won over the sizes that do measure bandwidth, leaving no fit).
    The widest qualifying range wins, ties going to larger sizes (`method` "range").
    Why a range: a real link is a straight line in bytes only piecewise — caches, protocol
    switches (NCCL's LL/LL128/Simple), eager vs rendezvous sends — and one line forced through
    every size describes none of them. The sizes left out are reported, not hidden.
    When no range qualifies (noise or outliers everywhere), the Theil-Sen line over every point
    (`fit_ring_theil_sen`, `method` "theil_sen") with `within_tolerance` False.

    Returns the fit dict plus `method`, `max_rel_residual` (largest |relative residual| over the
    points used) and `within_tolerance`. None when undetermined (fewer than two sizes) or when
    even the robust line shows no growth of time with size (`has_bandwidth_signal` False).
    """
    pts = sorted((float(x), float(t)) for x, t in points if t is not None and t > 0)
    best: tuple[tuple[int, int], Event] | None = None
    for i in range(len(pts)):
        for j in range(i + min_sizes, len(pts) + 1):
            fit = fit_ring_times(pts[i:j], world_size)
            if fit is None or max(abs(rel_residual(fit, x, t)) for x, t in pts[i:j]) > tolerance:
                continue
            if not has_bandwidth_signal(fit, pts[j - 1][0], tolerance):
                continue
            if best is None or (j - i, j) > best[0]:
                best = ((j - i, j), {**fit, "span": (i, j)})
    if best is not None:
        fit = best[1]
        i, j = fit.pop("span")
        used, ok, method = pts[i:j], True, "range"
    else:
        fit, used, ok, method = fit_ring_theil_sen(pts, world_size), pts, False, "theil_sen"
        if fit is None or not has_bandwidth_signal(fit, pts[-1][0], tolerance):
            return None
    worst = max(abs(rel_residual(fit, x, t)) for x, t in used)
    return {**fit, "method": method, "max_rel_residual": worst, "within_tolerance": ok}


def fit_ring_model(buckets: Iterable[Event], world_size: int) -> Event | None:
    """`fit_ring_times` over bucket events' all-reduce times (comm_end_s − comm_start_s)."""
    return fit_ring_times(((b["nbytes"], b["comm_end_s"] - b["comm_start_s"])
                           for b in buckets if _timed(b)), world_size)


# The one home of how a size or a rate is written: the unit that keeps the number readable
# (a 20-parameter model's 84 B gradients are "84 B", not "0.00 MiB").
BYTE_UNITS = [("B", 1), ("KiB", 1024), ("MiB", 2**20), ("GiB", 2**30)]  # binary, as PyTorch's memory stats
RATE_UNITS = [("B/s", 1), ("kB/s", 1e3), ("MB/s", 1e6), ("GB/s", 1e9)]  # decimal, as NCCL's algbw and busbw


def byte_unit(nbytes: float | None) -> tuple[str, float]:
    """(name, bytes in one) of the largest binary unit (B, KiB, MiB, GiB) not above `nbytes`;
    B for 0, None or NaN. Pick it once for a whole axis from the largest value on it."""
    return _unit(nbytes, BYTE_UNITS)


def format_bytes(nbytes: float | None) -> str:
    """`nbytes` with three significant figures in the unit `byte_unit` picks: "84 B", "3.39 KiB",
    "548 KiB", "25.0 MiB", "1.20 GiB"; "n/a" for None or NaN."""
    return _format(nbytes, BYTE_UNITS)


def format_rate(bytes_per_s: float | None) -> str:
    """A bandwidth in bytes/s, in decimal units (B/s, kB/s, MB/s, GB/s), three significant figures."""
    return _format(bytes_per_s, RATE_UNITS)


def _unit(value: float | None, units: list[tuple[str, float]]) -> tuple[str, float]:
    if value is None or value != value or value <= 0:
        return units[0]
    return [u for u in units if u[1] <= abs(value)][-1] if abs(value) >= 1 else units[0]


def _format(value: float | None, units: list[tuple[str, float]]) -> str:
    if value is None or value != value:
        return "n/a"
    name, size = _unit(value, units)
    v = value / size
    if size == 1 and float(v).is_integer():
        return f"{int(v)} {name}"
    digits = 0 if abs(v) >= 100 else 1 if abs(v) >= 10 else 2  # three significant figures, never "1e+03"
    return f"{v:,.{digits}f} {name}"


def fit_covers(fit: Event, sizes: Iterable[float]) -> bool:
    """Whether every size lies inside the sizes a ring model was fitted on (`points_used`); a model is
    extrapolated outside them, where a link's regime may differ (`fit_ring_range`). True with no sizes."""
    sizes, used = list(sizes), fit.get("points_used") or []
    return not sizes or bool(used) and min(used) <= min(sizes) and max(sizes) <= max(used)


def predict_ring_s(model: Event, nbytes: float) -> float:
    """All-reduce time the fitted model predicts for `nbytes`."""
    return model["latency_s"] + model["s_per_byte"] * nbytes


def probe_point(nbytes: int, time_s: float, world_size: int) -> dict[str, float]:
    """One probe point: algbw = nbytes / time_s, busbw = algbw · 2(n−1)/n (bytes/s; nccl-tests
    doc/PERFORMANCE.md, AllReduce)."""
    alg = nbytes / time_s if time_s > 0 else 0.0
    return {"nbytes": int(nbytes), "time_s": time_s, "algbw_bytes_per_s": alg,
            "busbw_bytes_per_s": alg * ring_factor(world_size)}


def probe_fit(points: list[dict[str, Any]], world_size: int) -> dict[str, Any] | None:
    """The ring model t = 2(n−1)·α + 2(n−1)/n · bytes/β fitted to the probe points
    (`fit_ring_range`: the widest contiguous range of sizes that one line predicts within
    FIT_TOLERANCE and whose time grows with size, by relative-error least squares with α, β ≥ 0;
    else a Theil-Sen line through every point).

    Returns ``{alpha_s, beta_bytes_per_s, latency_s, s_per_byte, points_used, method,
    max_rel_residual, tolerance, within_tolerance}`` (points_used: the sizes fitted, bytes;
    method "range" or "theil_sen"; within_tolerance False for "theil_sen"), or None when
    undetermined (fewer than two sizes) or when time does not grow with size beyond the noise
    (`probe_no_fit_reason` says why and what to do).
    """
    fit = fit_ring_range(((p["nbytes"], p["time_s"]) for p in points), world_size)
    if fit is None or not math.isfinite(fit["beta_bytes_per_s"]):
        return None
    keep = ("alpha_s", "beta_bytes_per_s", "latency_s", "s_per_byte", "points_used", "method",
            "max_rel_residual", "within_tolerance")
    return {**{k: fit[k] for k in keep}, "tolerance": FIT_TOLERANCE}


def probe_no_fit_reason(points: list[dict[str, Any]]) -> str | None:
    """Why `probe_fit` gave no line, and what to do; None when it gives one.

    Two cases: fewer than two sizes (a line is undetermined), or times that do not grow with
    size beyond FIT_TOLERANCE (the link's latency, or the host's noise, hides its bandwidth over
    the sizes probed — typically a budget that cut the ladder before the bandwidth-bound sizes).
    """
    sizes = sorted({p["nbytes"] for p in points if p.get("time_s")})
    if len(sizes) < 2:
        return ("not enough sizes: a line needs two or more; probe more sizes "
                "(ddpviz probe --max-bytes, --budget-s)")
    if probe_fit(points, 2) is not None:  # the signal test does not depend on world_size
        return None
    return (f"not enough signal: the all-reduce time did not grow with size beyond "
            f"{FIT_TOLERANCE:.0%} from {sizes[0]} to {sizes[-1]} bytes (latency or noise hides the "
            f"bandwidth); probe larger sizes or more repetitions (ddpviz probe --max-bytes, "
            f"--budget-s, --iters) on a quieter host")


def probe_busbw_at(points: list[Event], nbytes: float) -> float | None:
    """The probe's busbw (bytes/s) at `nbytes`, interpolated linearly in log2(size) between the
    two probed sizes around it; None outside [smallest, largest] probed size (no extrapolation:
    that would be a guess, not the probe's measurement)."""
    pts = sorted((p["nbytes"], p["busbw_bytes_per_s"]) for p in points if p.get("busbw_bytes_per_s"))
    if not pts or nbytes <= 0 or not pts[0][0] <= nbytes <= pts[-1][0]:
        return None
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= nbytes <= x1:
            f = 0.0 if x1 == x0 else (math.log2(nbytes) - math.log2(x0)) / (math.log2(x1) - math.log2(x0))
            return y0 + f * (y1 - y0)
    return pts[0][1]  # a single probed size, equal to nbytes


def busbw_vs_probe(buckets: Iterable[Event], probe_points: list[Event], world_size: int) -> list[Event]:
    """In-run bucket busbw against the probe's busbw at the same size, one row per bucket.

    Rows: step, rank, bucket_index, nbytes, alone (see `mark_alone`), busbw_bytes_per_s (the
    bucket's), probe_busbw_bytes_per_s (`probe_busbw_at`, None outside the probed sizes) and
    ratio = bucket / probe (None when either is missing). A ratio below 1 means the bucket moved
    its bytes slower than the link can: waiting for a slower rank, sharing the link with another
    collective (overlapped buckets), or CPU contention with the backward pass.
    """
    rows = []
    for b in bucket_bandwidths(mark_alone(buckets), world_size):
        probe = probe_busbw_at(probe_points, b["nbytes"])
        bus = b["busbw_bytes_per_s"]
        rows.append(dict(step=b.get("step"), rank=b.get("rank", 0), bucket_index=b.get("bucket_index"),
                         nbytes=b["nbytes"], alone=b["alone"], busbw_bytes_per_s=bus,
                         probe_busbw_bytes_per_s=probe,
                         ratio=bus / probe if bus and probe else None))
    return rows


def median_busbw_ratio(rows: Iterable[Event], alone_only: bool = True) -> float | None:
    """Median of `busbw_vs_probe` ratios (of buckets that ran alone, by default); None if none."""
    vals = [r["ratio"] for r in rows if r["ratio"] is not None and (r["alone"] or not alone_only)]
    return statistics.median(vals) if vals else None


def theory_bytes(mode: str, world_size: int, param_bytes: int) -> dict[int, int]:
    """Bytes each device sends (= receives) per step for the parameters/gradients, by device index."""
    n = world_size
    if mode == "dp":
        return {i: (n - 1) * param_bytes if i == 0 else param_bytes for i in range(n)}
    if mode == "ddp":
        return {i: int(ring_factor(n) * param_bytes) for i in range(n)}
    return {0: 0}


def busiest_bytes(p: dict[str, Any]) -> float:
    """Bytes sent + received per step on the busiest device of a scale-out prediction row
    (`engine.predict.scaleout.predict`): a DDP rank, twice its `bytes_per_rank` (each way: a ring all-reduce
    sends what it receives, 2(n−1)/n·P), or DP's device 0 (`device0_bytes`, sent + received already)."""
    return 2 * p["bytes_per_rank"] if "bytes_per_rank" in p else p.get("device0_bytes", 0.0)
