"""Charts of a run's steps: throughput curves, the step-time split, bytes moved per device.

Each takes the output of the matching `app.frames.steps` function and returns a chart with a
title, axis titles carrying units and a legend. Colours are fixed per category so two runs read
the same.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from ddpviz.app.charts.style import HEIGHT, PHASE_HUES, STEP_X, WIDTH, legend, rows_height, run_scale, title, volume_scale
from ddpviz.app.frames import steps as fsteps
from ddpviz.app.frames.base import MIB, device_order
from ddpviz.engine.analysis import byte_unit
from ddpviz.app.frames.steps import SMOOTH_STEPS, SPLIT_PARTS

_SPLIT_ROW_PX, _SPLIT_BAR_PX = 58, 22  # a run's row in the split: its name over its bar
_SPLIT_COLOURS = {p: PHASE_HUES[p] for p in SPLIT_PARTS}  # one colour per part, as on every page


def throughput_curves_chart(steps: pd.DataFrame, runs: list[str] | None = None,
                            modes: dict[str, str] | None = None) -> alt.LayerChart:
    """Samples/s per optimizer step, per run (`app.frames.steps.steps_frame` rows): a faint point per step
    and a line through the rolling median, so noise does not hide the difference.

    `runs` fixes the colour of each run (in this order) before all of them have data, so a
    run keeps its colour when the other one starts reporting; `modes` (run -> mode) colours each
    run by its mode (`app.charts.style.run_scale`)."""
    scale = run_scale(runs or list(steps["run"]), modes)
    colour = alt.Color("run:N", legend=legend("run"), scale=scale)
    x = STEP_X
    tip = [alt.Tooltip("run:N"), alt.Tooltip("step:Q"),
           alt.Tooltip("samples_per_s:Q", title="samples/s", format=",.0f"),
           alt.Tooltip("samples_per_s_smooth:Q", title="rolling median", format=",.0f"),
           alt.Tooltip("step_time_ms:Q", title="step time (ms)", format=".2f")]
    base = alt.Chart(steps)
    points = base.mark_circle(size=14, opacity=0.35).encode(
        x=x, y=alt.Y("samples_per_s:Q", title="throughput (samples/s)"), color=colour,
        tooltip=tip)
    line = base.mark_line(strokeWidth=2).encode(x=x, y="samples_per_s_smooth:Q", color=colour,
                                                tooltip=tip)
    return alt.layer(points, line).properties(
        title=title("Throughput per step", f"dots: each step (mean over ranks); line: rolling "
                     f"median of {SMOOTH_STEPS} steps"), width=WIDTH, height=HEIGHT)


def split_chart(split: pd.DataFrame) -> alt.LayerChart:
    """Median step time per run, stacked by part (`app.frames.steps.split_frame` rows), in ms.
    The legend names the parts present (DP's copies, others' exposed comm), under the plot; each
    run's name is written above its bar, not on the y axis, so a long name (an attached run's
    label) never takes the plot's width in a narrow column."""
    shown = [p for p in SPLIT_PARTS if p in set(split["part"])] or SPLIT_PARTS
    y = alt.Y("run:N", title="run", axis=alt.Axis(labels=False, ticks=False), sort=None)
    bars = alt.Chart(split).mark_bar(height=_SPLIT_BAR_PX).encode(
        x=alt.X("sum(ms):Q", title="median time per step (ms)", stack="zero"),
        y=y,
        color=alt.Color("part:N", legend=legend("part of the step", orient="bottom", columns=3),
                        scale=alt.Scale(domain=shown, range=[_SPLIT_COLOURS[p] for p in shown]),
                        sort=shown),
        order=alt.Order("order:Q"),
        tooltip=[alt.Tooltip("run:N"), alt.Tooltip("part:N"),
                 alt.Tooltip("ms:Q", title="median (ms)", format=".2f")],
    )
    names = alt.Chart(split).transform_aggregate(total="sum(ms)", groupby=["run"]).mark_text(
        align="left", baseline="bottom", dx=1, dy=-(_SPLIT_BAR_PX // 2) - 2, fontSize=11).encode(
        x=alt.datum(0), y=y, text="run:N")
    return alt.layer(bars, names).properties(  # + the legend's two rows under the plot
        title=title("Step time split", "median ms per step"), width=WIDTH,
        height=rows_height(split, "run", row_px=_SPLIT_ROW_PX) + 70)


def comm_volume_chart(volume: pd.DataFrame) -> alt.Chart:
    """Bytes each device sent + received in its latest reported step, in the unit the largest bar reads best in
    (`engine.analysis.byte_unit`) (measured, derived or unlabelled, as its
    events say: `app.frames.steps.comm_volume_frame`'s `source`, a legend entry for each) beside
    the theory.

    Raises:
        ValueError: a `source` that is none of `app.frames.steps.VOLUME_KINDS`."""
    which = list(volume["source"]) if "source" in volume else [fsteps.UNLABELLED] * len(volume)
    mib = list(volume["sent_mib"] + volume["recv_mib"]) + list(volume["theory_sent_mib"] + volume["theory_recv_mib"])
    unit, size = byte_unit(max((m for m in mib if m == m), default=0) * MIB)  # B for a tiny model, not 0.0002 MiB
    steps = list(volume["step"]) if "step" in volume else [None] * len(volume)  # DDP reports on some steps only
    long = pd.DataFrame({"device": list(volume["device"]) * 2, "which": which + [fsteps.THEORY] * len(volume),
                         "mib": mib, "amount": [m * MIB / size for m in mib], "step": steps * 2})
    scale = volume_scale(long["which"])
    return alt.Chart(long).mark_bar().encode(
        x=alt.X("amount:Q", title=f"sent + received per step ({unit})"),
        y=alt.Y("device:N", title="device", sort=device_order(long["device"])),
        yOffset=alt.YOffset("which:N", sort=scale.domain),
        color=alt.Color("which:N", legend=legend("bytes"), scale=scale),
        tooltip=[alt.Tooltip("device:N"), alt.Tooltip("which:N"),
                 alt.Tooltip("amount:Q", title=unit, format=",.3~f"), alt.Tooltip("step:Q", title="reported at step")],
    ).properties(title=title("Bytes moved per device", "each device's latest reported step (hover: which), beside "
                             "the theory"),  # no step number in the spec: Live keeps the view across refreshes
                 width=WIDTH, height=rows_height(volume, "device") + 20)
