"""Pure transforms for the DP timeline: idle gaps per device and time per phase.

Input is `app.frames.dp.dp_phase_frame` (ms from the step start). A device is idle where none of its
phases runs between the step's start and the end of the last phase on any device: in DP that is
devices 1..N-1 waiting while device 0 broadcasts, reduces and steps alone.

GIL wait (`gil_band_frame`, `gil_share_frame`): the `dp_phase` spans' `gil_wait_s` and the `gil`
events, measured by the engine (engine.measure.gil: the thread's CPU clock and run-queue wait from
schedstat); the total wait of a span is known, not where inside it the wait fell.
"""

from __future__ import annotations

from typing import Any, Iterable

import pandas as pd

from ddpviz.app.frames import base as frames
from ddpviz.app.frames import dp as fd
from ddpviz.app.frames.base import Event, device_order, latest_complete_step, of_type
from ddpviz.app.frames import steps as fsteps
from ddpviz.engine.summary import run_steps

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
    for device in device_order(phases["device"]):
        i = float(idle.get(device, 0.0))
        rows.append({"device": device, "busy_ms": span - i, "idle_ms": i,
                     "idle_pct": 100.0 * i / span if span > 0 else 0.0})
    return pd.DataFrame(rows, columns=cols)


def all_idle_ms(phases: pd.DataFrame) -> float:
    """ms of one step in which every device waits: no phase of any device covers them (the
    main thread between phases: Python, thread hand-offs, an instrumented step's own work).
    The step spans [0, max end over all devices], as in `idle_frame`."""
    if phases.empty:
        return 0.0
    end, t, idle = float(phases["end_ms"].max()), 0.0, 0.0
    for a, b in _busy_intervals(phases) + [(end, end)]:
        if a - t > MIN_GAP_MS:
            idle += a - t
        t = max(t, b)
    return idle


def typical_step(phase_steps: list[int], step_events: Iterable[Event]) -> int | None:
    """The step the DP timeline opens on: `app.frames.steps.typical_step` over the steps with
    complete phases (nearest the median steady step time, never one slowed by the instrument
    when another is kept)."""
    return fsteps.typical_step(phase_steps, step_events)


def metered_first(steps: list[int], gil_events: Iterable[Event]) -> list[int]:
    """Of `steps`, those with a measured `gil` event (the meter reads thread clocks on sampled
    steps only, `engine.measure.gil.MeterGate`), or all of `steps` when none has one."""
    metered = {e["step"] for e in of_type(gil_events, "gil") if e.get("gil_wait_share") is not None}
    return [s for s in steps if s in metered] or steps


def instrumented_steps(step_events: Iterable[Event]) -> set[int]:
    """Steps that carried the instrument's own work (memory tracing, a replica check)."""
    return {r["step"] for r in run_steps(of_type(step_events, "step")) if r["instrument"]}


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

    Columns: step, device, phase, order (index in `DP_PHASES`), start_ms, end_ms, dur_ms, nbytes,
    gil_wait_ms (the span's measured GIL wait; NaN where not measured).
    """
    cols = ["step", "device", "phase", "order", "start_ms", "end_ms", "dur_ms", "nbytes", "gil_wait_ms"]
    events = list(events)
    step = latest_complete_step(events, "dp_phase") if step is None else step
    evs = [e for e in of_type(events, "dp_phase") if e["step"] == step]
    if not evs:
        return pd.DataFrame(columns=cols)
    df = pd.DataFrame([{
        "step": e["step"], "device": e.get("device", "?"), "phase": e["phase"],
        "order": DP_PHASES.index(e["phase"]) if e["phase"] in DP_PHASES else len(DP_PHASES),
        "start_ms": e["start_s"] * 1000.0, "end_ms": e["end_s"] * 1000.0,
        "nbytes": int(e.get("nbytes") or 0),
        "gil_wait_ms": e["gil_wait_s"] * 1000.0 if e.get("gil_wait_s") is not None else float("nan")}
        for e in evs])
    df["dur_ms"] = df["end_ms"] - df["start_ms"]
    return df.sort_values(["device", "start_ms"]).reset_index(drop=True)[cols]


GIL_LANE = " · GIL wait"  # suffix of a device's GIL-wait lane on the timeline


def gil_band_frame(phases: pd.DataFrame) -> pd.DataFrame:
    """The GIL-wait band of one step: one row per span with a measured wait > 0.

    Columns: step, device, lane (device + `GIL_LANE`), phase, span_start_ms, span_end_ms,
    start_ms, end_ms (a bar as long as the wait, from the span's start, never past its end),
    gil_ms, span_ms, share_pct (of the span).
    """
    cols = ["step", "device", "lane", "phase", "span_start_ms", "span_end_ms", "start_ms", "end_ms",
            "gil_ms", "span_ms", "share_pct"]
    if phases.empty or "gil_wait_ms" not in phases:
        return pd.DataFrame(columns=cols)
    df = phases[phases["gil_wait_ms"].notna()]
    if df.empty:
        return pd.DataFrame(columns=cols)
    out = pd.DataFrame({
        "step": df["step"], "device": df["device"], "lane": df["device"] + GIL_LANE, "phase": df["phase"],
        "span_start_ms": df["start_ms"], "span_end_ms": df["end_ms"], "start_ms": df["start_ms"],
        "end_ms": (df["start_ms"] + df["gil_wait_ms"]).clip(upper=df["end_ms"]),
        "gil_ms": df["gil_wait_ms"], "span_ms": df["dur_ms"]})
    out["share_pct"] = [100.0 * g / s if s > 0 else 0.0 for g, s in zip(out["gil_ms"], out["span_ms"])]
    return out[cols].reset_index(drop=True)


def gil_share_frame(events: Iterable[Event], step: int | None = None) -> pd.DataFrame:
    """Per device, its `gil` events: this step's and the median over every step given.

    Columns: device, step_share (gil_wait_share of `step`, default the latest), step_gil_ms,
    median_share (over all steps with a measured share), steps (how many), source.
    Empty when no `gil` event has a measured share (an older run, or a machine without schedstat).
    """
    cols = ["device", "step_share", "step_gil_ms", "median_share", "steps", "source"]
    evs = [e for e in of_type(events, "gil") if e.get("gil_wait_share") is not None]
    if not evs:
        return pd.DataFrame(columns=cols)
    step = max(e["step"] for e in evs) if step is None else step
    rows = []
    for device in device_order(e["device"] for e in evs):
        mine = [e for e in evs if e["device"] == device]
        now = next((e for e in mine if e["step"] == step), None)
        rows.append({"device": device, "step_share": now["gil_wait_share"] if now else float("nan"),
                     "step_gil_ms": now["gil_wait_s"] * 1000.0 if now else float("nan"),
                     "median_share": float(pd.Series([e["gil_wait_share"] for e in mine]).median()),
                     "steps": len(mine), "source": mine[-1].get("source", "")})
    return pd.DataFrame(rows, columns=cols)


THREAD_STATES = (("on_cpu_s", "running (on a CPU)"), ("gil_wait_s", "waiting for the GIL"),
                 ("runnable_s", "waiting for a CPU (all cores busy)"),
                 ("thread_wait_s", "outside its timed work"), ("other_wait_s", "waiting for the all-reduce"))


def thread_states_frame(runs: dict[str, Iterable[Event]]) -> pd.DataFrame:
    """Where each device's threads spent a typical step, per run: the median over the run's `gil`
    events of each state's seconds (`THREAD_STATES`), measured by `engine.measure.gil`.

    `runs`: run label -> its events. Columns: run, device, state, ms, share (of the states' sum),
    order. Empty when no run has `gil` events with figures.
    """
    rows = []
    for label, events in runs.items():
        by_dev: dict[str, list[dict]] = {}
        for e in events:
            if e.get("type", "gil") == "gil" and e.get("gil_wait_s") is not None:
                by_dev.setdefault(e["device"], []).append(e)
        for dev, evs in sorted(by_dev.items()):
            med = {k: float(pd.Series([e.get(k) or 0.0 for e in evs]).median()) for k, _ in THREAD_STATES}
            total = sum(med.values()) or 1.0
            for order, (k, name) in enumerate(THREAD_STATES):
                rows.append({"run": label, "device": f"{label} · {dev}", "state": name,
                             "ms": med[k] * 1e3, "share": med[k] / total, "order": order})
    return pd.DataFrame(rows, columns=["run", "device", "state", "ms", "share", "order"])
