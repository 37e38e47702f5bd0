"""Pure transforms for the bucket timeline: steps kept, exposed communication, layouts.

Times are ms from the step's backward start, as in `app.frames.buckets.bucket_frame`. Exposed communication
of a rank is the part of its all-reduce work after its last bucket became ready: from that
moment backward has nothing left to hide it behind (the engine's `comm_exposed_s`).
"""

from __future__ import annotations

from typing import Any, Iterable

import pandas as pd

from ddpviz.app.frames import base as frames
from ddpviz.app.frames.base import MIB, latest_complete_step, of_type

Event = dict[str, Any]


def bucket_steps(events: Iterable[Event]) -> list[int]:
    """Steps whose `bucket` events are complete for every rank that sent any (ascending)."""
    by_step: dict[int, list[Event]] = {}
    for e in frames.of_type(events, "bucket"):
        by_step.setdefault(e["step"], []).append(e)
    done = [s for s, evs in by_step.items()
            if {e.get("rank", 0) for e in evs} == {e.get("rank", 0) for e in evs if e.get("is_last")}]
    return sorted(done)


def rank_names(events: Iterable[Event]) -> dict[int, str]:
    """``{rank: "rank r"}``, or ``"rank r @ host"`` when the events carry a `host` (multi-host)."""
    names: dict[int, str] = {}
    for e in events:
        if "rank" in e and e.get("type") in ("step", "bucket", "memory", "comm_volume"):
            r = int(e["rank"])
            if e.get("host"):
                names[r] = f"rank {r} @ {e['host']}"
            else:
                names.setdefault(r, f"rank {r}")
    return dict(sorted(names.items()))


def with_rank_names(df: pd.DataFrame, names: dict[int, str]) -> pd.DataFrame:
    """`df` (with a `rank` column) plus `lane`: the rank's display name."""
    return df.assign(lane=[names.get(int(r), f"rank {int(r)}") for r in df["rank"]])


def exposed_frame(buckets: pd.DataFrame, steps: Iterable[Event]) -> pd.DataFrame:
    """Per rank: the exposed part of communication in this step.

    Columns: rank, start_ms (last bucket ready), end_ms, exposed_ms, and reported_ms (the engine's
    `comm_exposed_s` of that rank's step event). The band is the run's own figure wherever the step has one:
    end_ms = start_ms + reported_ms, so its length is what the step split, the per-step chart and the exports
    say (the backward's time after its last bucket was ready, docs/measures.md); only a step without one falls
    back to the last all-reduce end (the last all-reduce's end minus the last ready: 1.24 ms drawn where the
    run reported 1.367 ms, a new user, 2026-12-06).
    """
    cols = ["rank", "start_ms", "end_ms", "exposed_ms", "reported_ms"]
    if buckets.empty:
        return pd.DataFrame(columns=cols)
    step = int(buckets["step"].iloc[0])
    reported = {int(e.get("rank", 0)): _ms(e.get("comm_exposed_s"))
                for e in frames.of_type(steps, "step") if e["step"] == step}
    g = buckets.groupby("rank").agg(start_ms=("ready_ms", "max"), end_ms=("comm_end_ms", "max"))
    g = g.reset_index()
    g["reported_ms"] = [reported.get(int(r), float("nan")) for r in g["rank"]]
    said = g["reported_ms"].notna()
    g.loc[said, "end_ms"] = g.loc[said, "start_ms"] + g.loc[said, "reported_ms"]
    g["end_ms"] = g[["start_ms", "end_ms"]].max(axis=1)
    g["exposed_ms"] = g["end_ms"] - g["start_ms"]
    return g[cols]


def timeline_end_ms(buckets: Iterable[Event], steps: Iterable[Event], step: int) -> float:
    """Where a run's timeline of `step` ends (ms from backward start): its latest all-reduce end, backward end or
    exposed band's end (`exposed_frame`), NaN when it has none; side-by-side timelines share the largest."""
    steps = list(steps)
    frame = bucket_frame(buckets, step)
    ends = [backward_frame(steps, step)["end_ms"].max()]
    if not frame.empty:
        ends += [frame["comm_end_ms"].max(), exposed_frame(frame, steps)["end_ms"].max()]
    ends = [e for e in ends if pd.notna(e)]
    return max(ends) if ends else float("nan")


def exposed_per_step(events: Iterable[Event], run: str) -> pd.DataFrame:
    """Exposed comm (ms, the slowest rank's) per step, for the overlap on/off comparison; NaN
    (not measured, never 0) for a step where a rank's `comm_exposed_s` is null."""
    per_rank: dict[int, list[float]] = {}
    for e in frames.of_type(events, "step"):
        per_rank.setdefault(e["step"], []).append(_ms(e.get("comm_exposed_s")))
    rows = {s: float("nan") if any(v != v for v in vs) else max(vs) for s, vs in per_rank.items()}
    return pd.DataFrame({"run": run, "step": list(rows), "exposed_ms": list(rows.values())},
                        columns=["run", "step", "exposed_ms"])


def layout_frame(buckets: list[dict[str, Any]] | None) -> pd.DataFrame:
    """A bucket layout (`bucket_preview` initial/rebuilt, or measured) as a table:
    bucket, KiB, tensors, parameters (in the order DDP reduces them: every name up to two, else the
    first and the last, "first … last", which a table cell holds; `layout_names` lists them all)."""
    rows = []
    for b in buckets or []:
        names = list(b.get("param_names") or [])
        shown = ", ".join(names) if len(names) <= 2 else f"{names[0]} … {names[-1]}"
        if b.get("sparse"):
            shown += " (sparse gradient: KiB of its values and indices)"
        rows.append({"bucket": int(b["bucket_index"]), "KiB": b.get("nbytes", 0) / 1024,
                     "tensors": b.get("num_params", len(names)), "parameters": shown})
    return pd.DataFrame(rows, columns=["bucket", "KiB", "tensors", "parameters"])


def layout_names(buckets: list[dict[str, Any]] | None) -> str:
    """Markdown: every bucket's parameter names, in the order DDP reduces them (`layout_frame`'s cells
    show the first and the last)."""
    return "\n".join(f"- bucket {int(b['bucket_index'])}: " + ", ".join(f"`{n}`" for n in b.get("param_names") or [])
                     for b in buckets or [])


def measured_layouts(events: Iterable[Event], rank: int = 0) -> dict[int, list[dict[str, Any]]]:
    """``{step: buckets}`` for each step where rank `rank`'s bucket events name their
    parameters (the layout appears or changes: step 0, and the rebuild after it)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for e in frames.of_type(events, "bucket"):
        if e.get("rank", 0) == rank and e.get("param_names"):
            out.setdefault(e["step"], []).append(e)
    return {s: sorted(bs, key=lambda b: b["bucket_index"]) for s, bs in sorted(out.items())}


def buckets_text(n: int) -> str:
    """'1 bucket', '2 buckets'."""
    return f"{n} bucket" + ("" if n == 1 else "s")


def layout_captions(preview: dict, capped_from_start: bool = False) -> tuple[str, str]:
    """What each layout table shows, with its real bucket count: step 0's layout (DDP's
    constructor: registration order, bucket list reversed) and the rebuilt one (gradient-ready
    order). Step 0 has several buckets when dtypes, devices or sparse gradients differ, or when
    the caps apply from the start (`capped_from_start`: find_unused_parameters without
    static_graph; engine.modes.ddp.buckets)."""
    initial, rebuilt = preview.get("initial") or [], preview.get("rebuilt") or []
    why = ""
    if len(initial) > 1:
        why = (" (find_unused_parameters: the caps apply from the start)" if capped_from_start else
               " (gradients of different dtypes, devices or a sparse gradient never share a bucket)")
    first = (f"Step 0, before the rebuild: {buckets_text(len(initial))}{why}. DDP fills them in "
             "registration order and reduces the last-registered first (bucket 0 below); each row "
             "lists its parameters in registration order.")
    cap, first_cap = preview.get("bucket_cap_bytes") or 0, preview.get("first_bucket_cap_bytes") or 0
    second = (f"After the rebuild: {buckets_text(len(rebuilt))} in the order gradients became ready, "
              f"cap {cap / 1024:,.0f} KiB (first bucket {first_cap / 1024:,.0f} KiB): DDP closes a bucket "
              "with the parameter that takes it to its cap or past it, so a bucket may hold more than its "
              "cap; each row lists its parameters in that order, the order DDP reduces them.")
    return first, second


def bucket_frame(events: Iterable[Event], step: int | None = None) -> pd.DataFrame:
    """Buckets of one DDP step (default: the latest complete one), times in ms from backward start.

    Columns: step, rank, ddp_index (which DDP of the process: an attached script may build
    several, e.g. a GAN's two; 0 when the events do not say), bucket_index, bucket (its name:
    "3", or "DDP 1 · 3" when the step has buckets of several DDPs), row (the bucket's row in a
    rank's lane, the same on every rank: DDP by DDP, bucket by bucket), nbytes (the bytes all-reduced: a comm
    hook's compressed tensors where one ran), gradient_nbytes (the bucket's own gradients: the event's
    `uncompressed_nbytes` where a hook ran, else nbytes), mib, num_params,
    ready_ms, comm_start_ms, comm_end_ms, comm_ms (end - start, else the event's `comm_duration_s`: a GPU
    duration with no span), algbw_gbps (bytes / all-reduce time, GB/s =
    1e9 B/s), enqueue_ms (the host's launch of the all-reduce, host clock: a CUDA step's no-hook
    path, not on the GPU's timeline), source (how the event says its fields were measured; "" when it
    does not say); the
    times are NaN (not measured, never 0) where the event's are null.
    """
    cols = ["step", "rank", "ddp_index", "bucket_index", "bucket", "row", "nbytes", "gradient_nbytes", "mib",
            "num_params",
            "ready_ms", "comm_start_ms", "comm_end_ms", "comm_ms", "algbw_gbps", "enqueue_ms", "source"]
    events = list(events)
    step = latest_complete_step(events, "bucket") if step is None else step
    evs = [e for e in of_type(events, "bucket") if e["step"] == step]
    if not evs:
        return pd.DataFrame(columns=cols)
    df = pd.DataFrame([{
        "step": e["step"], "rank": int(e.get("rank", 0)), "ddp_index": int(e.get("ddp_index") or 0),
        "bucket_index": int(e["bucket_index"]),
        "nbytes": int(e.get("nbytes", 0)), "num_params": e.get("num_params"),
        "gradient_nbytes": int(e.get("uncompressed_nbytes") or e.get("nbytes", 0)),
        "ready_ms": _ms(e.get("ready_s")), "comm_start_ms": _ms(e.get("comm_start_s")),
        "comm_end_ms": _ms(e.get("comm_end_s")), "duration_ms": _ms(e.get("comm_duration_s")),
        "enqueue_ms": _ms(e.get("enqueue_s")),
        "source": e.get("source") or ""} for e in evs])
    df["mib"] = df["nbytes"] / MIB
    # a GPU duration measured without a span (the flight recorder on NCCL) still gives the all-reduce's time
    df["comm_ms"] = (df["comm_end_ms"] - df["comm_start_ms"]).fillna(df["duration_ms"])
    secs = (df["comm_ms"] / 1000.0).where(df["comm_ms"] > 0)
    df["algbw_gbps"] = df["nbytes"] / secs / 1e9
    keys = sorted(set(zip(df["ddp_index"], df["bucket_index"])))
    several = len({d for d, _ in keys}) > 1
    df["row"] = [keys.index(k) for k in zip(df["ddp_index"], df["bucket_index"])]
    df["bucket"] = [f"DDP {d} · {b}" if several else str(b) for d, b in zip(df["ddp_index"], df["bucket_index"])]
    return df.sort_values(["rank", "row"]).reset_index(drop=True)[cols]


def _ms(seconds: float | None) -> float:
    """Seconds -> ms; NaN for None: a span not measured on that step (an unsampled step's bucket
    carries bytes and order, its times only when sampled), never 0."""
    return float("nan") if seconds is None else float(seconds) * 1000.0


def measured_steps(events: Iterable[Event]) -> list[int]:
    """Steps of `bucket_steps` whose every bucket has its times (ready, all-reduce start and end)."""
    missing = {e["step"] for e in frames.of_type(events, "bucket")
               if None in (e.get("ready_s"), e.get("comm_start_s"), e.get("comm_end_s"))}
    return [s for s in bucket_steps(events) if s not in missing]


def backward_frame(events: Iterable[Event], step: int) -> pd.DataFrame:
    """Backward span of each rank in `step`: rank, start_ms (0), end_ms (= backward_s)."""
    rows = [{"rank": int(e.get("rank", 0)), "start_ms": 0.0,
             "end_ms": e.get("backward_s", 0.0) * 1000.0}
            for e in of_type(events, "step") if e["step"] == step]
    return pd.DataFrame(rows, columns=["rank", "start_ms", "end_ms"])


def cap_text(cap_mb) -> str:
    """A bucket cap in MiB to 3 significant digits, never in exponent form: an attached run's is DDP's own
    byte cap over 2**20 (0.0049991607666015625 for a script's 0.005 -> "0.005"; 1000 -> "1,000", which
    read "1e+03" before 2026-12-06)."""
    if not isinstance(cap_mb, (int, float)):
        return str(cap_mb)
    v = float(f"{cap_mb:.3g}")
    return f"{v:,.0f}" if v >= 100 else f"{v:f}".rstrip("0").rstrip(".")


def synced_backwards_note(step_events: Iterable[Event], step: int) -> str:
    """"", or where `step` ran several backwards that all-reduced (an attached script accumulating gradients
    without `no_sync()`: `micro_steps` - `no_sync_micro_steps` > 1 on some rank), a clause saying the buckets
    drawn are its last backward's (an attached step's bucket events; `comm_volume` counts every backward's)."""
    synced = [int(e.get("micro_steps") or 0) - int(e.get("no_sync_micro_steps") or 0)
              for e in of_type(step_events, "step") if e.get("step") == step]
    n = max(synced, default=0)
    return (f" · the last of its {n} backwards that all-reduced (each sent its buckets; bytes per device count "
            "them all)" if n > 1 else "")
