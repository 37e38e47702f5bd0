"""Chart builders of the DP timeline page (pure: `DataFrame -> alt.Chart`).

Phases keep the Live page's colours (`app.charts.style.PHASE_COLOURS`); idle
gaps are drawn as pale hatched-looking bars with the device's idle share written beside its lane.
The GIL wait the engine measured in each span is a thin dark bar on a lane of its own under the
device's (`app.frames.dp.gil_band_frame`), as long as the wait, on a thin grey line spanning the phase it
fell in: where inside the span is not measured.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from ddpviz.app.charts.style import (
    GIL_COLOUR,
    PHASE_COLOURS,
    PHASE_HUES,
    THREAD_STATE_HUES,
    WIDTH,
    drawn_scale,
    legend,
    rows_height,
    title,
)
from ddpviz.app.frames.base import device_order
from ddpviz.app.frames.dp import DP_PHASES, GIL_LANE

IDLE = "idle (waiting)"
GIL = "waiting for the GIL (measured: schedstat)"
TRACK_COLOUR = "#bbbbbb"  # a GIL lane's track: the span its wait fell in
_DOMAIN, _RANGE = DP_PHASES + [IDLE, GIL], PHASE_COLOURS + [PHASE_HUES["idle"], GIL_COLOUR]
_PHASE = alt.Color("phase:N", legend=legend("phase", orient="bottom", columns=5),
                   scale=alt.Scale(domain=_DOMAIN, range=_RANGE), sort=_DOMAIN)
_PHASE_ONLY = alt.Color("phase:N", legend=legend("phase", columns=1),
                        scale=alt.Scale(domain=DP_PHASES, range=PHASE_COLOURS), sort=DP_PHASES)
LEGEND_PX = 80  # the timeline's legend below the plot (two rows)


def dp_timeline(phases: pd.DataFrame, idle: pd.DataFrame, summary: pd.DataFrame, *,
                run: str, gil: pd.DataFrame | None = None) -> alt.LayerChart:
    """One DP step per device: phases (`app.frames.dp.dp_phase_frame`), idle gaps
    (`app.frames.dp.idle_frame`), each device's idle share (`app.frames.dp.idle_summary`) and,
    when `gil` (`app.frames.dp.gil_band_frame`) has rows, a GIL-wait lane under each device."""
    step = int(phases["step"].iloc[0]) if not phases.empty else None
    devices = device_order(phases["device"]) if not phases.empty else []
    with_gil = gil is not None and not gil.empty
    lanes = [lane for d in devices for lane in ((d, d + GIL_LANE) if with_gil else (d,))]
    y = alt.Y("device:N", title="device", sort=lanes, scale=alt.Scale(domain=lanes),
              axis=alt.Axis(labelLimit=0))
    x = alt.X("start_ms:Q", title="ms from step start")
    span = float(phases["end_ms"].max()) if not phases.empty else 0.0
    bars = alt.Chart(phases).mark_bar(height=alt.RelativeBandSize(0.7), stroke="white",
                                      strokeWidth=0.5).encode(
        x=x, x2="end_ms:Q", y=y, color=_PHASE,
        tooltip=[alt.Tooltip("device:N"), alt.Tooltip("phase:N"),
                 alt.Tooltip("start_ms:Q", title="start (ms)", format=".2f"),
                 alt.Tooltip("dur_ms:Q", title="duration (ms)", format=".2f"),
                 alt.Tooltip("nbytes:Q", title="bytes copied", format=",")])
    gaps = alt.Chart(idle.assign(phase=IDLE)).mark_bar(
        height=alt.RelativeBandSize(0.7), stroke="#bbbbbb", strokeDash=[3, 2],
        strokeWidth=1).encode(
        x=x, x2="end_ms:Q", y=y, color=_PHASE,
        tooltip=[alt.Tooltip("device:N"), alt.Tooltip("dur_ms:Q", title="idle (ms)",
                                                      format=".2f")])
    text = alt.Chart(summary.assign(x=span, label=[f" {p:.0f}% idle" for p in
                                                    summary["idle_pct"]])).mark_text(
        align="left", dx=4, fontSize=13, fontWeight="bold", color="#444").encode(
        x="x:Q", y=y, text="label:N")
    label = f"{run}: step {step}" if step is not None else run
    layers = [gaps, bars, text]
    row_px = 56
    if with_gil:
        layers += _gil_layers(gil, x, y)
        row_px = 40  # two lanes per device
    t = title(label, "device 0 broadcasts, reduces and steps while the others wait"
              + ("; GIL lanes: a dark bar as long as the threads waited for the GIL in the phase on its grey "
                 "line (where inside it, not measured)" if with_gil else ""))
    # the title's lines get their own room: a longer subtitle shrank the lanes and Vega hid every other label
    return alt.layer(*layers).properties(
        title=t, width=WIDTH,
        height=rows_height(phases, "device", row_px=2 * row_px if with_gil else row_px, title_params=t) + LEGEND_PX)


def _gil_layers(gil: pd.DataFrame, x: alt.X, y: alt.Y) -> list[alt.Chart]:
    """The GIL lanes: each span as a thin grey track, and on it a bar as long as its measured wait."""
    y = alt.Y("lane:N", title=y.to_dict().get("title"), sort=y.to_dict().get("sort"),
              scale=alt.Scale(domain=y.to_dict().get("sort")))
    tip = [alt.Tooltip("device:N"), alt.Tooltip("span_phase:N", title="phase"),
           alt.Tooltip("gil_ms:Q", title="waited for the GIL (ms)", format=".3f"),
           alt.Tooltip("span_ms:Q", title="span (ms)", format=".3f"),
           alt.Tooltip("share_pct:Q", title="% of the span", format=".0f")]
    data = gil.rename(columns={"phase": "span_phase"}).assign(phase=GIL)
    # the span as a thin track, not a box: white boxes outlined in grey read as the idle gaps above them (a new
    # user, 2026-12-06), and a lane of them as idle time where the threads ran and never waited
    outline = alt.Chart(data).mark_rule(strokeWidth=1, color=TRACK_COLOUR).encode(
        x=alt.X("span_start_ms:Q", title=x.to_dict().get("title")), x2="span_end_ms:Q", y=y, tooltip=tip)
    wait = alt.Chart(data).mark_bar(height=alt.RelativeBandSize(0.35)).encode(
        x=x, x2="end_ms:Q", y=y, color=_PHASE, tooltip=tip)
    return [outline, wait]


def phase_totals_chart(totals: pd.DataFrame, *, run: str) -> alt.Chart:
    """Median ms per step each device spends in each phase (`app.frames.dp.phase_totals`)."""
    return alt.Chart(totals).mark_bar(height=alt.RelativeBandSize(0.6)).encode(
        x=alt.X("sum(ms):Q", title="median time per step (ms)", stack="zero"),
        y=alt.Y("device:N", title="device", sort=device_order(totals["device"])),
        color=_PHASE_ONLY, order=alt.Order("order:Q"),
        tooltip=[alt.Tooltip("device:N"), alt.Tooltip("phase:N"),
                 alt.Tooltip("ms:Q", title="median (ms)", format=".3f")],
    ).properties(title=title(f"{run}: busy time per device by phase",
                             "median over the kept steps; device 0 carries the extra phases"),
                 width=WIDTH, height=max(280, rows_height(totals, "device")))


def dp_phase_chart(phases: pd.DataFrame) -> alt.Chart:
    """One DP step per device, bars coloured by phase (`app.frames.dp.dp_phase_frame`, ms from the
    step start)."""
    # no step number in the title: the spec stays the same from one Live refresh to the next,
    # so Streamlit keeps the view (and a tooltip on screen); the panel's caption names the step
    return alt.Chart(phases).mark_bar(height=alt.RelativeBandSize(0.7), stroke="white",
                                      strokeWidth=0.5).encode(
        x=alt.X("start_ms:Q", title="ms from step start"), x2="end_ms:Q",
        y=alt.Y("device:N", title="device", sort=device_order(phases["device"])),
        color=alt.Color("phase:N", legend=alt.Legend(title="phase", orient="right", columns=2),
                        scale=alt.Scale(domain=DP_PHASES, range=PHASE_COLOURS), sort=DP_PHASES),
        tooltip=[alt.Tooltip("device:N"), alt.Tooltip("phase:N"),
                 alt.Tooltip("dur_ms:Q", title="duration (ms)", format=".2f"),
                 alt.Tooltip("nbytes:Q", title="bytes copied", format=",")],
    ).properties(title=title("DP phases", "a typical step: device 0 takes part in every copy (its bar: the whole "
                                             "phase) and alone steps the optimizer; another device's bar is its own "
                                             "copies to or from device 0"),
                 width=WIDTH, height=max(230, rows_height(phases, "device")))  # 4 legend rows


# legend entries per row, below the chart: three ran past a whole page column at 1024 px ("waiting for
# a CPU (machine lo", seen in Chromium)
_STATE_COLUMNS = 2
LEGEND_ROW_PX = 22  # the legend's title, and each row of its entries


def thread_states_chart(states: pd.DataFrame) -> alt.Chart:
    """Where each device's thread spent a typical step, DP's threads beside DDP's ranks
    (`app.frames.dp.thread_states_frame`): the lock passing between DP's threads shows in the
    GIL's colour. A state no device spent time in is left out, bars and legend: DP's threads
    never wait for an all-reduce, and a DDP rank only where its wait was measured apart."""
    states = states[states.groupby("state")["ms"].transform("sum") > 0]
    from ddpviz.engine.measure.gil import METER_EVERY_STEPS, METER_FIRST_STEPS

    # the metered steps only, warm-up among them: a bar can exceed Compare's median step, which a new user took
    # for a contradiction when this said "over the run's steps" (2026-12-06)
    t = title("The lock: each device's thread in a step",
              "DP: one process, a thread per device, one GIL; DDP: a process per device, each with its own. "
              f"Medians over the metered steps (the first {METER_FIRST_STEPS}, warm-up included, then one in "
              f"{METER_EVERY_STEPS}), each state's apart: a bar need not add up to the median step on Compare.")
    return alt.Chart(states).mark_bar(height=alt.RelativeBandSize(0.6)).encode(
        x=alt.X("sum(ms):Q", title="median time per step (ms)", stack="zero"),
        y=alt.Y("device:N", title=None, sort=None, axis=alt.Axis(labelLimit=0)),
        color=alt.Color("state:N", scale=drawn_scale(THREAD_STATE_HUES, states["state"]),
                        legend=legend("thread state (measured: schedstat)", orient="bottom",
                                      columns=_STATE_COLUMNS)),
        order=alt.Order("order:Q"),
        tooltip=[alt.Tooltip("device:N"), alt.Tooltip("state:N"),
                 alt.Tooltip("ms:Q", title="median ms per step", format=".3f"),
                 alt.Tooltip("share:Q", title="share of the step", format=".0%")],
    ).properties(title=t, width=WIDTH,
                 # Streamlit fits the whole chart in `height`: the wrapped subtitle and the legend below
                 # take their rows out of it, or the bands shrink to a pixel (a DDP-only run, seen in Chromium)
                 height=rows_height(states, "device", title_params=t)
                 + LEGEND_ROW_PX * (1 + -(-states["state"].nunique() // _STATE_COLUMNS)))
