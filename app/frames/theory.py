"""Pure transforms for the Theory page: the all-reduce probe, in-run buckets and ring-model fits.

Formulas are `engine.analysis`'s: algbw = bytes / time, busbw = algbw · 2(n−1)/n (nccl-tests,
doc/PERFORMANCE.md); ring all-reduce time t = 2(n−1)·α + 2(n−1)/n · bytes/β = a + c·bytes, fitted
by relative-error least squares. GB/s = 1e9 bytes/s; KiB = 1024 bytes.

Which points feed which fit:
- the probe (`allreduce_probe` event, engine/modes/ddp/probe.py): all-reduces timed one at a time after
  training; its fit (`fit` in the event) uses the widest range of sizes one line describes;
- in-run buckets: a bucket's all-reduce time is a bandwidth measurement only when no other
  bucket's all-reduce of the same rank and step was in flight with it (`engine.analysis.
  mark_alone`): gloo runs two collectives at once per process group. Step 0 is left out of the
  bucket fit (one big bucket before DDP's rebuild, and first-call set-up costs).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import pandas as pd

from ddpviz.app.frames import base as frames
from ddpviz.engine.analysis import (
    bucket_bandwidths,
    busbw_vs_probe,
    fit_covers,
    fit_ring_model,
    format_bytes,
    mark_alone,
    median_busbw_ratio,
    predict_ring_s,
    ring_factor,
)

Event = dict[str, Any]
MAX_SCATTER = 4000  # bucket points drawn at most (the newest kept)
LINE_POINTS = 40  # points per fitted-model curve (log-spaced)

PROBE_BUS = "probe busbw (measured)"
PROBE_ALG = "probe algbw (measured)"
PROBE_TIME = "probe all-reduce time (measured)"
ALONE = "in-run bucket, ran alone (measured)"
OVERLAPPED = "in-run bucket, overlapped another (measured; not fitted)"
FIT_PROBE = "ring model fitted to the probe (fitted model)"
FIT_BUCKETS = "ring model fitted to alone buckets (fitted model)"
SERIES = [PROBE_BUS, PROBE_ALG, PROBE_TIME, ALONE, OVERLAPPED, FIT_PROBE, FIT_BUCKETS]


def latest_probe(events: Iterable[Event]) -> Event | None:
    """The run's `allreduce_probe` event (the last one, if several), else None."""
    probes = frames.of_type(events, "allreduce_probe")
    return probes[-1] if probes else None


def probe_frame(probe: Event | None) -> pd.DataFrame:
    """One row per probed size: nbytes, kib, time_ms, algbw_gbps, busbw_gbps, fitted (the size
    is in the fit's `points_used`)."""
    cols = ["nbytes", "kib", "time_ms", "algbw_gbps", "busbw_gbps", "fitted"]
    if not probe or not probe.get("points"):
        return pd.DataFrame(columns=cols)
    used = set((probe.get("fit") or {}).get("points_used") or [])
    rows = [{"nbytes": p["nbytes"], "kib": p["nbytes"] / 1024, "time_ms": p["time_s"] * 1e3,
             "algbw_gbps": p["algbw_bytes_per_s"] / 1e9, "busbw_gbps": p["busbw_bytes_per_s"] / 1e9,
             "fitted": p["nbytes"] in used} for p in probe["points"]]
    return pd.DataFrame(rows, columns=cols)


def bucket_frame(events: Iterable[Event], world_size: int, min_step: int = 0) -> pd.DataFrame:
    """One row per bucket all-reduce: step, rank, bucket_index, nbytes, kib, time_ms
    (comm_end_s − comm_start_s), algbw_gbps, busbw_gbps, alone, series (ALONE or OVERLAPPED);
    steps ≥ `min_step`; the newest `MAX_SCATTER` rows. Overlap is judged on every bucket first,
    so trimming never splits a (step, rank)."""
    cols = ["step", "rank", "bucket_index", "nbytes", "kib", "time_ms", "algbw_gbps", "busbw_gbps",
            "alone", "series"]
    marked = [b for b in mark_alone(frames.of_type(events, "bucket")) if b["step"] >= min_step]
    marked = marked[-MAX_SCATTER:]
    rows = [{"step": b["step"], "rank": int(b.get("rank", 0)), "bucket_index": b["bucket_index"],
             "nbytes": b["nbytes"], "kib": b["nbytes"] / 1024, "time_ms": b["comm_s"] * 1e3,
             "algbw_gbps": (b["algbw_bytes_per_s"] or math.nan) / 1e9,
             "busbw_gbps": (b["busbw_bytes_per_s"] or math.nan) / 1e9, "alone": b["alone"],
             "series": ALONE if b["alone"] else OVERLAPPED}
            for b in bucket_bandwidths(marked, world_size)]
    return pd.DataFrame(rows, columns=cols)


def bucket_fit(events: Iterable[Event], world_size: int) -> tuple[Event | None, dict[str, int]]:
    """The ring model fitted to the buckets that ran alone, steps ≥ 1.

    Returns (model or None, counts) where counts has `timed` (bucket all-reduces with both
    times), `warmup` (of those, step 0, left out), `overlapped` (steps ≥ 1, left out) and
    `used` (steps ≥ 1 that ran alone, fitted). The model is None with fewer than two sizes.
    """
    marked = mark_alone(frames.of_type(events, "bucket"))
    late = [b for b in marked if b["step"] >= 1]
    used = [b for b in late if b["alone"]]
    counts = dict(timed=len(marked), warmup=len(marked) - len(late),
                  overlapped=len(late) - len(used), used=len(used))
    return (fit_ring_model(used, world_size) if used else None), counts


def model_lines(fits: dict[str, Event | None], lo_bytes: float, hi_bytes: float,
                world_size: int) -> pd.DataFrame:
    """Each fitted model over [lo_bytes, hi_bytes], log-spaced: series, nbytes, kib, time_ms,
    busbw_gbps (busbw = 2(n−1)/n · bytes / t(bytes)). A model whose time does not grow with size
    (no β) is left out: its busbw would grow without bound (`describe_fit` says so in words). A model
    that names the sizes it was fitted to (`points_used`, two or more) is drawn over those sizes only:
    a line fitted to 2–16 MiB and carried down to 4 KiB predicted 0.005 ms where the probe measured
    0.7 ms (a new user, 2026-12-06); the points it was not fitted to stay on the chart, hollow."""
    cols = ["series", "nbytes", "kib", "time_ms", "busbw_gbps"]
    if not lo_bytes or not hi_bytes or hi_bytes < lo_bytes:
        return pd.DataFrame(columns=cols)
    rows = []
    for series, model in fits.items():
        if model is None or not model.get("s_per_byte", 0) > 0:
            continue
        used = model.get("points_used") or []
        lo, hi = (max(lo_bytes, min(used)), min(hi_bytes, max(used))) if len(used) >= 2 else (lo_bytes, hi_bytes)
        if hi < lo:
            continue
        span = math.log(hi / lo)
        for x in (lo * math.exp(span * i / (LINE_POINTS - 1)) for i in range(LINE_POINTS)):
            t = predict_ring_s(model, x)
            rows.append({"series": series, "nbytes": x, "kib": x / 1024, "time_ms": t * 1e3,
                         "busbw_gbps": ring_factor(world_size) * x / t / 1e9 if t > 0 else math.nan})
    return pd.DataFrame(rows, columns=cols)


def size_range(*frames_: pd.DataFrame) -> tuple[float, float]:
    """(smallest, largest) `nbytes` over the frames, (0, 0) when all are empty."""
    sizes = [v for df in frames_ if not df.empty for v in (df["nbytes"].min(), df["nbytes"].max())]
    return (min(sizes), max(sizes)) if sizes else (0.0, 0.0)


def ratio_summary(events: Iterable[Event], probe: Event | None, world_size: int) -> dict[str, Any]:
    """In-run bucket busbw ÷ probe busbw at the same size (`engine.analysis.busbw_vs_probe`),
    steps ≥ 1: `median_alone`, `median_all` (None when no ratio), `n_alone`, `n_outside`
    (buckets outside the probed sizes, no ratio)."""
    if not probe:
        return dict(median_alone=None, median_all=None, n_alone=0, n_outside=0)
    late = [b for b in frames.of_type(events, "bucket") if b.get("step", 0) >= 1]
    rows = busbw_vs_probe(late, probe.get("points") or [], world_size)
    return dict(median_alone=median_busbw_ratio(rows), median_all=median_busbw_ratio(rows, False),
                n_alone=sum(1 for r in rows if r["alone"] and r["ratio"] is not None),
                n_outside=sum(1 for r in rows if r["probe_busbw_bytes_per_s"] is None))


# ---- words for the page ------------------------------------------------------------------------
def peers(world_size: int) -> str:
    """"the other rank" (2 ranks) or "the other ranks": the words for whom a rank waits."""
    return "the other rank" if world_size == 2 else "the other ranks"


def describe_fit(model: Event, world_size: int) -> str:
    """α and β of a fitted model in µs and GB/s, with the line they make (or why there is no β:
    time not growing with size means waiting and noise dominate, not bytes)."""
    if model["s_per_byte"] <= 0:
        return (f"time does not grow with size here (best line: flat at "
                f"{model['latency_s'] * 1e3:.3f} ms), so no bandwidth can be read from it: "
                f"waiting for {peers(world_size)} and noise dominate, not bytes")
    if model["latency_s"] <= 0:  # on the fit's bound (a ≥ 0): these sizes cannot show a latency
        return (f"α not resolved: the best line through these sizes meets zero time at zero bytes (its latency "
                f"is held at its bound, 0), so they are bandwidth-bound and say nothing of the latency; "
                f"β = {model['beta_bytes_per_s'] / 1e9:.3f} GB/s — t(bytes) = bytes × "
                f"{model['s_per_byte'] * 1e9:.3f} ns/B over these sizes only")
    return (f"α = {model['alpha_s'] * 1e6:.1f} µs per hop (2(n−1) = {2 * (world_size - 1)} hops), "
            f"β = {model['beta_bytes_per_s'] / 1e9:.3f} GB/s — t(bytes) = "
            f"{model['latency_s'] * 1e3:.3f} ms + bytes × {model['s_per_byte'] * 1e9:.3f} ns/B")


MISS_FACTOR = 2.0  # a fit that misses the probe's own time at a size by more than this is not drawn from there


def fit_miss(probe: Event | None, nbytes: float) -> str | None:
    """Why the probe's ring fit must not be carried to `nbytes` (bytes), or None: `nbytes` lies outside the sizes
    it was fitted to and, at the probe's measured size nearest to it (by ratio), the fit's time is more than
    `MISS_FACTOR` times off the measured one. A fit over 8-32 KiB (latency-bound) put a 198 KiB all-reduce at
    16.6 ms where the probe measured 0.634 ms, and Learn drew its theory on it (a new user, 2026-12-06)."""
    fit, pts = (probe or {}).get("fit"), [p for p in (probe or {}).get("points") or [] if p.get("time_s")]
    if not fit or not pts or not nbytes or fit_covers(fit, [nbytes]):
        return None
    near = min(pts, key=lambda p: abs(math.log(p["nbytes"] / nbytes)))
    said, got = predict_ring_s(fit, near["nbytes"]), near["time_s"]
    off = max(said / got, got / said) if said > 0 else math.inf
    if off <= MISS_FACTOR:
        return None
    used = fit["points_used"]
    return (f"the probe's ring fit (sizes {format_bytes(used[0])}–{format_bytes(used[-1])}) says "
            f"{said * 1e3:.3g} ms at {format_bytes(near['nbytes'])}, where the probe measured {got * 1e3:.3g} ms "
            f"({off:.0f}× off): it is not carried to {format_bytes(nbytes)}")


def probe_note(probe: Event, world_size: int) -> str:
    """Which probe sizes were measured, which were fitted, and why the others were not."""
    pts = probe.get("points") or []
    fit = probe.get("fit")
    sizes = (f"{len(pts)} sizes from {format_bytes(pts[0]['nbytes'])} to {format_bytes(pts[-1]['nbytes'])}, each"
             if len(pts) > 1 else f"one size, {format_bytes(pts[0]['nbytes'])},")
    text = (f"**Probe** (measured after training, {probe.get('backend')}, float32): {sizes} "
            f"the median of {probe.get('iters')} all-reduces timed one at a time (a barrier before "
            f"each, after {probe.get('warmup_iters')} warm-up rounds), the slowest rank's.")
    if probe.get("run_nbytes"):
        text += (f" First the run's own bucket sizes ({', '.join(format_bytes(b) for b in probe['run_nbytes'])}), "
                 "so each in-run bucket is compared with the probe at its size.")
    if probe.get("skipped_nbytes"):
        text += (f" Skipped by the {probe.get('budget_s', 0):g} s time budget: "
                 f"{', '.join(format_bytes(b) for b in probe['skipped_nbytes'])}.")
    if not fit:
        return text + (" No ring model: its time did not grow with size." if len(pts) > 1 else
                       " No ring model: a line needs at least two sizes.")
    used = fit["points_used"]
    left = [p["nbytes"] for p in pts if p["nbytes"] not in set(used)]
    misses = [m for m in (fit_miss(probe, b) for b in probe.get("run_nbytes") or []) if m]
    text += (f" Ring model fitted to the {len(used)} sizes {format_bytes(used[0])}–{format_bytes(used[-1])}: "
             f"{describe_fit(fit, world_size)}.")
    if fit.get("within_tolerance", True):
        text += (f" That is the widest range of sizes one line predicts within "
                 f"{fit.get('tolerance', 0.2):.0%} (worst miss {fit.get('max_rel_residual', 0):.0%})")
        text += (f"; not fitted: {', '.join(format_bytes(b) for b in left)}, where the time leaves that "
                 "line (a noisy size, or a change of regime: caches, protocols): see the hollow "
                 "probe points."
                 if left else ".")
    else:
        text += (f" No range of sizes fits one line within {fit.get('tolerance', 0.2):.0%}, so "
                 f"every size was fitted; the worst miss is {fit.get('max_rel_residual', 0):.0%}.")
    if misses:  # the run's own bucket sizes lie where the line misses the probe: say so, not only "hollow points"
        text += f" Beware at the run's bucket sizes: {misses[0]}."
    return text


def bucket_note(model: Event | None, counts: dict[str, int], world_size: int, backend: str | None = "gloo") -> str:
    """How many in-run buckets fed the bucket fit and why the rest did not (why two overlap: in
    the words of the run's `backend`)."""
    why = ("gloo runs up to two collectives at once per process group (ProcessGroupGloo's 2 worker "
           "threads), so their times share the link" if backend == "gloo" else
           "their times share the link")
    text = (f"**In-run buckets**: {counts['timed']} bucket all-reduces kept on this page; "
            f"{counts['warmup']} from step 0 left out (one big bucket before DDP's rebuild, "
            f"first-call set-up); {counts['overlapped']} overlapped another bucket's all-reduce on "
            f"the same rank and step — {why} and are not bandwidths — left out; {counts['used']} ran alone.")
    if model is None:
        return text + (" No ring model from them: they need at least two bucket sizes "
                       "(lower bucket_cap_mb, or a wider model).")
    return text + f" Ring model fitted to those {counts['used']}: {describe_fit(model, world_size)}."


RATIO_FEW_BUCKETS = 8  # fewer buckets that ran alone than this: the in-run ÷ probe median is called rough


def ratio_note(summary: dict[str, Any], world_size: int = 2) -> str:
    """The in-run ÷ probe busbw figure in words."""
    if summary["median_alone"] is None:
        return ("In-run busbw ÷ probe busbw: no bucket that ran alone lies within the probed sizes"
                + (f" ({summary['n_outside']} outside them)." if summary["n_outside"] else "."))
    text = (f"In-run bucket busbw ÷ probe busbw at the same size (probe interpolated in log size): "
            f"median **{summary['median_alone']:.2f}×** over {summary['n_alone']} buckets that ran "
            f"alone")
    if summary["median_all"] is not None:
        text += f" ({summary['median_all']:.2f}× counting the overlapped ones too)"
    text += (f". Below 1, a bucket waited for {peers(world_size)} or shared the CPU with backward; above 1, the "
             f"probe's own all-reduce was slower than the run's at that size (the probe is interpolated between "
             f"the sizes it measured, and each is a few timings on a machine whose speed moves).")
    if summary["n_alone"] < RATIO_FEW_BUCKETS:
        text += (f" Only {summary['n_alone']} bucket(s): a rough figure (the median of fewer than "
                 f"{RATIO_FEW_BUCKETS}), not a property of the link.")
    return text


def link_note(backend: str | None, world_size: int, nnodes: int = 1) -> str:
    """What "the link" that α and β describe is, for the run's `backend` (from its `run_started`),
    `world_size` and hosts (`nnodes`). One rank: an all-reduce with no peer moves no bytes, so
    there is no link and no bandwidth to speak of."""
    if world_size <= 1:
        return ("One rank: its all-reduce has no peer, so it moves no bytes and measures no link; "
                "bandwidth and the ring model need two ranks or more.")
    name = backend or "its backend"
    if nnodes > 1:
        return (f"The link is {name} across {nnodes} hosts, so α and β describe the network between "
                "them (and each host's load), not one machine.")
    if backend == "gloo":
        return ("On one host gloo's \"link\" is loopback (TCP through the kernel), so α and β describe "
                "that (and CPU caches and load), not a network.")
    if backend == "nccl":
        return ("On one host NCCL's link is the path it chose between these GPUs (NVLink, PCIe or "
                "shared memory), so α and β describe that, not a network.")
    return f"The link is {name} on one host: α and β describe that, not a network."
