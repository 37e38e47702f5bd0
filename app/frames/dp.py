"""Pure transforms for the DP timeline: idle gaps per device and time per phase.

Input is `app.frames.dp.dp_phase_frame` (ms from the step start). A device is idle where none of its
phases runs between the step's start and the end of the last phase on any device: in DP that is
devices 1..N-1 waiting while device 0 broadcasts, reduces and steps alone.
"""

from __future__ import annotations

from typing import Any, Iterable

import pandas as pd

from app.frames import base as frames
from app.frames import dp as fd
from app.frames.base import Event, latest_complete_step, of_type

MIN_GAP_MS = 1e-3  # gaps shorter than this are clock noise, not idle time


def dp_steps(events: Iterable[dict[str, Any]]) -> list[int]:
    """Steps whose DP phases are complete (device 0 reached `optimizer`), ascending."""
    return sorted({e["step"] for e in frames.of_type(events, "dp_phase")
                   if e.get("phase") == "optimizer"})


def _busy_intervals(df: pd.DataFrame) -> list[tuple[float, float]]:
    """Union of [start, end) intervals, sorted."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(zip(df["start_ms"], df["end_ms"])):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def idle_frame(phases: pd.DataFrame) -> pd.DataFrame:
    """Idle gaps of one step: columns step, device, start_ms, end_ms, dur_ms.

    The step spans [0, max end over all devices]; a gap is any part of it no phase of that device
    covers."""
    cols = ["step", "device", "start_ms", "end_ms", "dur_ms"]
    if phases.empty:
        return pd.DataFrame(columns=cols)
    step, end = int(phases["step"].iloc[0]), float(phases["end_ms"].max())
    rows = []
    for device, df in phases.groupby("device", sort=True):
        t = 0.0
        for a, b in _busy_intervals(df) + [(end, end)]:
            if a - t > MIN_GAP_MS:
                rows.append({"step": step, "device": device, "start_ms": t, "end_ms": a})
            t = max(t, b)
    out = pd.DataFrame(rows, columns=cols[:-1])
    out["dur_ms"] = out["end_ms"] - out["start_ms"]
    return out[cols]


def idle_summary(phases: pd.DataFrame) -> pd.DataFrame:
    """Per device: busy_ms, idle_ms and idle_pct (of the step's span) in one step."""
    cols = ["device", "busy_ms", "idle_ms", "idle_pct"]
    if phases.empty:
        return pd.DataFrame(columns=cols)
    span = float(phases["end_ms"].max())
    idle = idle_frame(phases).groupby("device")["dur_ms"].sum()
    rows = []
    for device in sorted(phases["device"].unique()):
        i = float(idle.get(device, 0.0))
        rows.append({"device": device, "busy_ms": span - i, "idle_ms": i,
                     "idle_pct": 100.0 * i / span if span > 0 else 0.0})
    return pd.DataFrame(rows, columns=cols)


def phase_totals(events: Iterable[dict[str, Any]], steps: list[int]) -> pd.DataFrame:
    """Median ms per step of each (device, phase) over `steps` (skip step 0 when others exist):
    columns device, phase, order, ms."""
    cols = ["device", "phase", "order", "ms"]
    events = list(events)
    use = [s for s in steps if s > 0] or steps
    parts = [fd.dp_phase_frame(events, s) for s in use]
    parts = [p for p in parts if not p.empty]
    if not parts:
        return pd.DataFrame(columns=cols)
    df = pd.concat(parts)
    per_step = df.groupby(["step", "device", "phase", "order"], as_index=False)["dur_ms"].sum()
    med = per_step.groupby(["device", "phase", "order"], as_index=False)["dur_ms"].median()
    return med.rename(columns={"dur_ms": "ms"})[cols].sort_values(["device", "order"]) \
        .reset_index(drop=True)


DP_PHASES = ["broadcast", "scatter", "forward", "gather", "loss", "backward", "reduce", "optimizer"]


def dp_phase_frame(events: Iterable[Event], step: int | None = None) -> pd.DataFrame:
    """DP phases of one step (default: the latest complete one), ms from the step start.

    Columns: step, device, phase, order (index in `DP_PHASES`), start_ms, end_ms, dur_ms, nbytes.
    """
    cols = ["step", "device", "phase", "order", "start_ms", "end_ms", "dur_ms", "nbytes"]
    events = list(events)
    step = latest_complete_step(events, "dp_phase") if step is None else step
    evs = [e for e in of_type(events, "dp_phase") if e["step"] == step]
    if not evs:
        return pd.DataFrame(columns=cols)
    df = pd.DataFrame([{
        "step": e["step"], "device": e.get("device", "?"), "phase": e["phase"],
        "order": DP_PHASES.index(e["phase"]) if e["phase"] in DP_PHASES else len(DP_PHASES),
        "start_ms": e["start_s"] * 1000.0, "end_ms": e["end_s"] * 1000.0,
        "nbytes": int(e.get("nbytes") or 0)} for e in evs])
    df["dur_ms"] = df["end_ms"] - df["start_ms"]
    return df.sort_values(["device", "start_ms"]).reset_index(drop=True)[cols]
