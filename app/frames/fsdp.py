"""Pure transforms for FSDP runs: events (docs/events.md) -> DataFrames the FSDP charts draw.

- `collective_frame`: one step's `fsdp_collective` events, one row per all-gather or
  reduce-scatter per rank, ms from the step's forward start (measured spans and tensor bytes).
- `pass_frame`: the same step's forward and backward spans per rank (`step.phase_spans`).
- `memory_curve_frame`: one rank's within-step memory, long by kind (`fsdp_memory_curve`).
- `curve_caption`: that curve's highest sampled point beside the step's measured (ledger) peak.
- `shard_frame`: who holds which slice of a unit when sharded, during the all-gather and during
  the reduce-scatter, sized by the measured shard bytes (the Learn page's third picture).
"""

from __future__ import annotations

from typing import Any, Iterable

import pandas as pd

from ddpviz.app.frames.base import MIB, of_type
from ddpviz.app.frames.memory import SOURCE_LABELS
from ddpviz.engine.summary import FSDP_HOST_BLOCKING

CPU_NOTE = (f"On CPU, {FSDP_HOST_BLOCKING} here; on GPUs they run on separate CUDA streams and the next unit's "
            "all-gather hides behind the current unit's compute.")

Event = dict[str, Any]
KINDS = ["all-gather (forward)", "all-gather (backward)", "reduce-scatter"]
LANES = ["compute", "all-gather", "reduce-scatter"]  # sub-rows of a rank's lane
MEMORY_KINDS = ["sharded_params", "unsharded_params", "sharded_grads", "unsharded_grads",
                "optimizer_state", "comm_buffers", "activations", "buffers"]
SHARD_ROLES = ["own shard", "received in all-gather", "sent for reduce-scatter",
               "kept: reduced shard", "not held"]
COLLECTIVE_COLUMNS = ["step", "rank", "unit", "kind", "lane", "phase", "start_ms", "end_ms", "dur_ms",
                      "nbytes", "mib", "shard_nbytes", "dtype", "seq"]


def latest_collective_step(events: Iterable[Event]) -> int | None:
    """Newest step with `fsdp_collective` events from every rank that sent any (else the newest)."""
    evs = of_type(events, "fsdp_collective")
    if not evs:
        return None
    ranks = {e.get("rank", 0) for e in evs}
    by_step: dict[int, set[int]] = {}
    for e in evs:
        by_step.setdefault(e["step"], set()).add(e.get("rank", 0))
    complete = [s for s, r in by_step.items() if r == ranks]
    return max(complete) if complete else max(by_step)


def _kind(e: Event) -> str:
    if e["kind"] == "reduce_scatter":
        return KINDS[2]
    return KINDS[0] if e["phase"] == "forward" else KINDS[1]


def collective_frame(events: Iterable[Event], step: int | None = None) -> pd.DataFrame:
    """One FSDP step's collectives (default: the latest complete step), times in ms."""
    events = list(events)
    step = latest_collective_step(events) if step is None else step
    evs = [e for e in of_type(events, "fsdp_collective") if e["step"] == step and e.get("end_s") is not None]
    if not evs:
        return pd.DataFrame(columns=COLLECTIVE_COLUMNS)
    df = pd.DataFrame([{
        "step": e["step"], "rank": int(e.get("rank", 0)), "unit": e["unit"], "kind": _kind(e),
        "lane": LANES[2] if e["kind"] == "reduce_scatter" else LANES[1], "phase": e["phase"],
        "start_ms": e["start_s"] * 1000.0, "end_ms": e["end_s"] * 1000.0, "nbytes": int(e["nbytes"]),
        "shard_nbytes": int(e.get("shard_nbytes") or 0), "dtype": e.get("dtype"), "seq": e.get("seq")}
        for e in evs])
    df["dur_ms"] = df["end_ms"] - df["start_ms"]
    df["mib"] = df["nbytes"] / MIB
    return df.sort_values(["rank", "start_ms"]).reset_index(drop=True)[COLLECTIVE_COLUMNS]


def pass_frame(events: Iterable[Event], step: int) -> pd.DataFrame:
    """Forward and backward spans of every rank in `step` (ms from the step start)."""
    rows = [{"rank": int(e.get("rank", 0)), "lane": LANES[0], "kind": f"{s['phase']} (compute + blocking comm)",
             "phase": s["phase"], "start_ms": s["start_s"] * 1000.0, "end_ms": s["end_s"] * 1000.0}
            for e in of_type(events, "step") if e["step"] == step for s in e.get("phase_spans") or []]
    return pd.DataFrame(rows, columns=["rank", "lane", "kind", "phase", "start_ms", "end_ms"])


def memory_curve_frame(events: Iterable[Event], rank: int = 0, step: int | None = None) -> pd.DataFrame:
    """One rank's within-step memory by kind: step, rank, t_ms, label, phase, kind, mib, rss_mib.

    Default step: the newest curve of that rank. Kinds as in `engine.modes.fsdp.memory` (bytes of the
    tensors alive at each point); `rss_mib` is the process's resident memory then.
    """
    cols = ["step", "rank", "t_ms", "label", "phase", "kind", "mib", "rss_mib"]
    curves = [e for e in of_type(events, "fsdp_memory_curve") if e.get("rank", 0) == rank]
    if step is not None:
        curves = [e for e in curves if e["step"] == step]
    if not curves:
        return pd.DataFrame(columns=cols)
    e = max(curves, key=lambda c: c["step"])
    rows = [{"step": e["step"], "rank": rank, "t_ms": p["t_s"] * 1000.0, "label": p["label"],
             "phase": p["phase"], "kind": k, "mib": p.get(k, 0) / MIB, "rss_mib": p["rss_bytes"] / MIB}
            for p in e["points"] for k in MEMORY_KINDS]
    return pd.DataFrame(rows, columns=cols)


def curve_caption(curve: pd.DataFrame, memory_events: Iterable[Event]) -> str:
    """The caption under the curve by kind: its highest sampled point beside the step's measured
    peak (the ledger's, from that rank's `memory` event), which the samples can only miss."""
    step, rank = int(curve["step"].iloc[0]), int(curve["rank"].iloc[0])
    sampled = curve.groupby("t_ms")["mib"].sum().max()
    mem = [e for e in memory_events if e.get("step") == step and e.get("rank", 0) == rank]
    peak = mem[0].get("peak_allocated_bytes") if mem else None
    source = SOURCE_LABELS.get(mem[0].get("source"), mem[0].get("source")) if mem else None
    measured = (f"measured peak {peak / MIB:.2f} MiB ({source}, over the whole step: backward and optimizer "
                f"temporaries included)") if peak is not None else "no measured peak for it"
    return (f"Step {step}, rank {rank}: {measured}; highest point sampled at FSDP's hooks {sampled:.2f} MiB. "
            f"The process's resident memory (psutil RSS, includes the PyTorch runtime) reached "
            f"{curve['rss_mib'].max():.0f} MiB at those points")


def shard_frame(events: Iterable[Event], unit: str | None = None) -> pd.DataFrame:
    """Who holds which slice of one unit, in three pictures (the Learn page).

    Columns: picture (sharded | all-gather | reduce-scatter), holder ("rank r"), slice ("i"),
    role (`SHARD_ROLES`), mib (the measured shard bytes of that unit's collective). Default
    unit: the one with the largest all-gather. Rank r's own slice is slice r (Shard(0)).
    """
    cols = ["picture", "holder", "slice", "role", "mib", "unit"]
    evs = [e for e in of_type(events, "fsdp_collective") if e.get("rank", 0) == 0]
    gathers = [e for e in evs if e["kind"] == "all_gather"]
    if not gathers:
        return pd.DataFrame(columns=cols)
    unit = unit or max(gathers, key=lambda e: e["nbytes"])["unit"]
    g = next(e for e in gathers if e["unit"] == unit)
    rs = next((e for e in evs if e["kind"] == "reduce_scatter" and e["unit"] == unit), g)
    n = max(1, round(g["nbytes"] / max(1, g["shard_nbytes"])))
    rows = []
    for r in range(n):
        for i in range(n):
            own = r == i
            rows += [
                ("sharded", r, i, SHARD_ROLES[0] if own else SHARD_ROLES[4], g["shard_nbytes"]),
                ("all-gather", r, i, SHARD_ROLES[0] if own else SHARD_ROLES[1], g["shard_nbytes"]),
                ("reduce-scatter", r, i, SHARD_ROLES[3] if own else SHARD_ROLES[2], rs["shard_nbytes"])]
    df = pd.DataFrame(rows, columns=["picture", "holder", "slice", "role", "nbytes"])
    df["holder"] = "rank " + df["holder"].astype(str)
    df["slice"] = df["slice"].astype(str)
    df["mib"] = df["nbytes"] / MIB
    df["unit"] = unit
    return df[cols]
