"""The memory chart: one traced step, as it happened (`app.frames.memory` inputs).

First: the bytes each device holds through the step (live tensors on CPU, the CUDA allocator on
GPU) over bands showing where the phases fall, so activations rise in forward and fall in
backward, and DP's device 0 shows the gather and the reduce. Then: the whole process (RSS) or the
whole GPU (NVML), which include what is not a tensor (the interpreter, libraries, the CUDA
context). Every line's `source` is in the legend.

`memory_over_run_charts`: the memory timer's readings over the whole run, one chart per source
(their scales differ: a process's RSS against the tensors a GPU holds), one line per device.
"""

from __future__ import annotations

import math

import altair as alt
import pandas as pd

from ddpviz.app.charts.style import PHASE_COLOURS, PHASE_HUES, WIDTH, device_scale, legend, stacked_legends, title
from ddpviz.app.frames.base import MIB, device_order
from ddpviz.engine.analysis import byte_unit
from ddpviz.app.frames.dp import DP_PHASES
from ddpviz.app.frames.memory import DEVICE_SOURCES, HOST_SOURCES, SOURCE_LABELS, TIMER_NOTES
from ddpviz.engine.events import AFTER_STEP_PHASE, REPLICA_CHECK_PHASE

_DASH = {SOURCE_LABELS["tensors"]: [1, 0], SOURCE_LABELS["cuda"]: [6, 3],
         SOURCE_LABELS["process"]: [2, 2], SOURCE_LABELS["nvml"]: [8, 2, 2, 2]}
# box heights (px): the plot (~200 and ~60) plus title, legends on top (one under the other) and
# below, and the x axis
_HELD_PX, _HOST_PX = 580, 420
# the instrument's own time in a traced step (engine.events): DP's checksums, and the window after a
# step; one colour, so one legend entry (the tooltip names which)
INSTRUMENT = "instrument's work"
_INSTRUMENT_PHASES = (REPLICA_CHECK_PHASE, AFTER_STEP_PHASE)
_PHASE_COLOUR = dict(zip(DP_PHASES, PHASE_COLOURS)) | {INSTRUMENT: PHASE_HUES["instrument"]}
# phase legend entries a row: DP's nine in three rows fit a half column at 1280 px beside the y axis
# (four a row ran past it: "optimi", seen in a fresh user's tour)
_PHASE_COLUMNS = 3
# a device legend, four entries a row: eight GPUs in one row ran past a half column
_DEVICE_LEGEND = legend("device", orient="top", symbolType="square", columns=4)
LEGEND_DEVICES_MAX = 16  # past this many, no device legend: 64 devices' legend (4 columns, 16 rows) crushed the
# plot to ~10 px under "...35 entries" (a new user, 2026-12-06); each line's tooltip names its device


def device_legend(devices) -> alt.Legend | None:
    """The device colour legend, or None (no legend) for more than `LEGEND_DEVICES_MAX` devices."""
    return _DEVICE_LEGEND if len(set(devices)) <= LEGEND_DEVICES_MAX else None
_TO_THE_DATA = alt.Scale(nice=False, zero=True)  # a time axis from 0 to the last reading, set by the data
_STEP_X_TITLE = "ms from the step's start"


def memory_curve_charts(curve: pd.DataFrame, phases: pd.DataFrame, run: str,
                        y_max_mib: float | None = None) -> list[alt.Chart]:
    """One run's traced step on one time axis: the bytes each device holds over the step's
    phases (background bands, device 0 / rank 0), then the process / GPU when present. Legends
    sit on top, one under the other, so the plots share their width and line up, and no legend
    row runs past a half-column chart (`app.charts.style.stacked_legends`). Heights are whole
    boxes (title, legends, axis: `app.charts.style`). A chart with no line is not drawn (an older
    run's one-off readings have no curve): no empty plot, no legend of sources it lacks.

    Pass the same `y_max_mib` to runs shown side by side so their device curves compare."""
    where = curve[curve["source"].isin(DEVICE_SOURCES)]
    host = curve[curve["source"].isin(HOST_SOURCES)]
    span = max([0.0, *curve["t_ms"], *phases.get("end_ms", [])]) or 1.0
    # the time axis ends at the step's last reading or phase: the data sets it (nice off), never
    # the spec, so a live refresh with a longer step keeps the chart's view (and a tooltip on it)
    x = alt.X("t_ms:Q", title=_STEP_X_TITLE, scale=_TO_THE_DATA)
    charts = [] if where.empty else [_held_chart(where, phases, x, run, y_max_mib)]
    if not host.empty:
        y = alt.Y("mib:Q", title="MiB", axis=MIB_AXIS, scale=alt.Scale(nice=False, zero=False))
        lo, hi = mib_domain(host["mib"])  # whole MiB around a nearly flat line, as data (`_extent`)
        charts.append(alt.layer(_lines(host, x, y), _extent(x, y, t_ms=[0.0, span], mib=[lo, hi])).properties(
            title=title(*_host_words(set(host["source"]))),
            width=WIDTH, height=_HOST_PX))
    return [stacked_legends(c, "top") for c in charts]


def _host_words(sources: set[str]) -> tuple[str, str]:
    """The host chart's title and subtitle for the sources it draws: a CPU run's says RSS only (it
    said "or GPU (NVML)" on a CPU-only run: the tour, issue 33)."""
    if sources <= {"process"}:
        return "The whole process (RSS)", "includes what is not a tensor: the interpreter, its libraries"
    if sources <= {"nvml"}:
        return "The whole GPU (NVML)", "includes what is not a tensor: CUDA contexts, libraries, other processes"
    return ("The whole process (RSS) and GPU (NVML)",
            "includes what is not a tensor: the interpreter, libraries, CUDA contexts")


def _held_chart(where: pd.DataFrame, phases: pd.DataFrame, x: alt.X, run: str,
                y_max_mib: float | None) -> alt.Chart:
    """The bytes each device holds (`where`: the device sources' rows) over the phase bands."""
    head = f"Memory within a step: {run}"  # the step is in the caption: a spec without it survives a refresh
    # the unit the largest value reads best in (a Linear(20, 1) holds KiB, not "0.0004 MiB"), from the
    # shared y_max so side-by-side runs share it too; MiB keeps the field "mib"
    top_mib = y_max_mib if y_max_mib else float(where["mib"].max())
    unit, size = byte_unit(top_mib * MIB)
    unit, size = ("MiB", MIB) if size > MIB else (unit, size)  # GiB: MiB ticks read fine, as before
    field = "mib" if size == MIB else "amount"
    where = where.assign(amount=where["mib"] * MIB / size)
    y_max = nice_ceiling(y_max_mib * MIB / size if y_max_mib else None)
    held = _lines(where, x, alt.Y(f"{field}:Q", title=f"bytes held ({unit})", scale=alt.Scale(
        domain=[0, y_max], nice=True) if y_max else alt.Scale(zero=True)), (field, unit))
    if not phases.empty:
        held = alt.layer(_phase_bands(phases), held).resolve_scale(color="independent")
    return held.properties(title=title(head, "bytes each device holds, measured; background: phases of device 0"),
                           width=WIDTH, height=_HELD_PX)


def _extent(x: alt.X, y: alt.Y, **cols: list[float]) -> alt.Chart:
    """An invisible layer whose two rows stretch the x and y scales to `cols` (same fields as the
    lines'): the extent travels as data, so the spec, and the live view, stay the same."""
    return alt.Chart(pd.DataFrame(cols)).mark_point(opacity=0, size=1).encode(x=x, y=y)


def _lines(df: pd.DataFrame, x: alt.X, y: alt.Y, tip: tuple[str, str] = ("mib", "MiB")) -> alt.Chart:
    shown = [s for s in _DASH if s in set(df["source_label"])] or list(_DASH)
    dashes = alt.Scale(domain=shown, range=[_DASH[s] for s in shown])
    return alt.Chart(df).mark_line(interpolate="step-after", strokeWidth=2,
                                   point=alt.OverlayMarkDef(size=6, opacity=0.5)).encode(
        x=x, y=y,
        color=alt.Color("device:N", legend=device_legend(df["device"]),
                        scale=device_scale(device_order(df["device"]))),
        strokeDash=alt.StrokeDash("source_label:N", scale=dashes,
                                  # a fill colour too: over a line with points Vega draws the stroke
                                  # symbol with none (no swatch, seen in Chromium); size: the dashes show
                                  legend=legend("source", orient="top", columns=1, symbolType="stroke",
                                                symbolStrokeColor="#444", symbolStrokeWidth=2,
                                                symbolFillColor="#444", symbolSize=300)),
        detail="source:N",
        tooltip=[alt.Tooltip("device:N"), alt.Tooltip("source_label:N", title="source"),
                 alt.Tooltip("t_ms:Q", title="ms from step start", format=".2f"),
                 alt.Tooltip(f"{tip[0]}:Q", title=tip[1], format=".2f")])


MIB_AXIS = alt.Axis(tickMinStep=1, format=",.0f")  # whole MiB: "662", never "662.0312" or bytes
MIN_SPAN_MIB = 8.0  # a y range at least this wide, so a flat process line still gets a few ticks


def mib_domain(mib: pd.Series) -> list[float]:
    """A y range in whole MiB around `mib` (a process's RSS, a GPU's used memory: large, nearly
    flat): the data's span plus a tenth each side, at least `MIN_SPAN_MIB`, so the axis shows a few
    whole-MiB ticks rather than one label or many digits."""
    lo, hi = float(mib.min()), float(mib.max())
    half = max((hi - lo) * 0.6, MIN_SPAN_MIB / 2)
    mid = (lo + hi) / 2
    return [max(0.0, math.floor(mid - half)), math.ceil(mid + half)]


def nice_ceiling(mib: float | None) -> float | None:
    """The smallest of 1, 2, 5 x 10^k MiB at or above `mib` (None stays None): a shared y scale
    that changes only when a run's peak crosses one of these, so a chart's spec (and the view,
    with any tooltip on screen) survives most refreshes."""
    if not mib or mib <= 0:
        return mib
    k = math.floor(math.log10(mib))
    return next(m * 10.0 ** e for e in (k, k + 1) for m in (1, 2, 5) if m * 10.0 ** e >= mib)


def _phase_bands(phases: pd.DataFrame) -> alt.Chart:
    """Device 0's phases as background bands, coloured by `band` (the phase; the instrument's two
    as `INSTRUMENT`, their one colour)."""
    phases = phases.assign(band=phases["phase"].where(~phases["phase"].isin(_INSTRUMENT_PHASES), INSTRUMENT))
    shown = [p for p in _PHASE_COLOUR if p in set(phases["band"])]
    return alt.Chart(phases).mark_rect(opacity=0.22).encode(
        x=alt.X("start_ms:Q", scale=_TO_THE_DATA, title=_STEP_X_TITLE), x2="end_ms:Q",
        color=alt.Color("band:N", legend=legend("phase (background)", orient="bottom", columns=_PHASE_COLUMNS),
                        scale=alt.Scale(domain=shown, range=[_PHASE_COLOUR[p] for p in shown]),
                        sort=shown),
        tooltip=[alt.Tooltip("phase:N"), alt.Tooltip("start_ms:Q", title="start (ms)", format=".2f"),
                 alt.Tooltip("end_ms:Q", title="end (ms)", format=".2f")])


def memory_over_run_charts(run_memory: pd.DataFrame, run: str) -> list[alt.LayerChart]:
    """One chart per source of `app.frames.memory.memory_over_run_frame`: seconds since the run
    started against MiB, a line per device (the mean of each bin's readings) over a band (their
    min–max), so a leak, a growing cache or one device's hot spot shows over the whole run."""
    charts = []
    for source in [s for s in ("cuda", "nvml", "process") if s in set(run_memory["source"])]:
        df = run_memory[run_memory["source"] == source]
        bin_s = float(df["bin_s"].max())
        # the axis ends at the last reading, not a padded round number: set by the data (nice
        # off), never the spec, so the live view survives each refresh
        x = alt.X("t_s:Q", title="seconds since the run started", scale=_TO_THE_DATA)
        y = alt.Y("lo_mib:Q", title="MiB", axis=MIB_AXIS, scale=alt.Scale(nice=False, zero=False))
        lo, hi = mib_domain(pd.concat([df["lo_mib"], df["hi_mib"]]))
        colour = alt.Color("device:N", legend=device_legend(df["device"]),
                           scale=device_scale(device_order(df["device"])))
        tip = [alt.Tooltip("device:N"), alt.Tooltip("t_s:Q", title="s since start", format=".1f"),
               alt.Tooltip("mib:Q", title="mean MiB", format=",.2f"),
               alt.Tooltip("lo_mib:Q", title="min MiB", format=",.2f"),
               alt.Tooltip("hi_mib:Q", title="max MiB", format=",.2f"), alt.Tooltip("readings:Q")]
        band = alt.Chart(df).mark_area(opacity=0.2, interpolate="step-after").encode(
            x=x, y=y, y2="hi_mib:Q", color=colour)
        line = alt.Chart(df).mark_line(interpolate="step-after", strokeWidth=2).encode(
            x=x, y="mib:Q", color=colour, tooltip=tip)
        layers = [band, line]
        shape = f"line: mean of each {bin_s:g} s bin, band: its min–max"
        if df.groupby("device")["t_s"].nunique().min() < 2:  # one bin: a line of one point draws nothing
            layers.append(alt.Chart(df).mark_point(filled=True, size=70).encode(x=x, y="mib:Q", color=colour,
                                                                                 tooltip=tip))
            shape = (f"a point: the mean of the run's {int(df['readings'].sum())} reading(s), all in one "
                     f"{bin_s:g} s bin (a short run)")
        charts.append(alt.layer(*layers, _extent(x, y, t_s=[0.0, 0.0], lo_mib=[lo, hi])).properties(
            title=title(f"Memory over the run: {SOURCE_LABELS.get(source, source)}",
                        f"{run} · measured: the memory timer's readings (20/s per device), {TIMER_NOTES[source]}; "
                        + shape),
            width=WIDTH, height=_HOST_PX))
    return charts
