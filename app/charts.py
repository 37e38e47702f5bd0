"""Pure chart builders: `DataFrame -> alt.Chart`, one per panel of the Live page.

The analysis pages' builders live beside it by concept: `charts_compare`, `charts_buckets`
(the bucket timeline, Live's too), `charts_dp`, `charts_theory`, `charts_sweeps`,
`charts_cluster`, `charts_topology`; Live's step-axis chart is `charts_live`.

Each takes the output of the matching `app.frames` function and returns a chart with a title,
axis titles carrying units and a legend, so it can be checked through `chart.to_dict()` without
a browser. Colours are fixed per category (phases, timeline kinds) so two runs read the same.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from app.chart_style import (CATEGORIES, HEIGHT, PHASE_COLOURS, STEP_X, WIDTH, legend,
                             rows_height, title)
from app import frames
from app.frames import DP_PHASES, SMOOTH_STEPS, SPLIT_PARTS

_SPLIT_COLOURS = ["#1f77b4", "#ff7f0e", "#d62728", "#2ca02c", "#c7c7c7"]


def throughput_chart(steps: pd.DataFrame, runs: list[str] | None = None) -> alt.LayerChart:
    """Samples/s per optimizer step, per run (`frames.steps_frame` rows): a faint point per step
    and a line through the rolling median, so noise does not hide the difference.

    `runs` fixes the colour of each run (in this order) before all of them have data, so a
    run keeps its colour when the other one starts reporting."""
    scale = alt.Scale(domain=runs, scheme="tableau10") if runs else CATEGORIES
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


def split_chart(split: pd.DataFrame) -> alt.Chart:
    """Median step time per run, stacked by part (`frames.split_frame` rows), in ms."""
    return alt.Chart(split).mark_bar(height=alt.RelativeBandSize(0.6)).encode(
        x=alt.X("sum(ms):Q", title="median time per step (ms)", stack="zero"),
        y=alt.Y("run:N", title="run", axis=alt.Axis(labelLimit=0)),  # run names never cut
        color=alt.Color("part:N", legend=legend("part of the step"),
                        scale=alt.Scale(domain=SPLIT_PARTS, range=_SPLIT_COLOURS),
                        sort=SPLIT_PARTS),
        order=alt.Order("order:Q"),
        tooltip=[alt.Tooltip("run:N"), alt.Tooltip("part:N"),
                 alt.Tooltip("ms:Q", title="median (ms)", format=".2f")],
    ).properties(title=title("Step time split", "median ms per step"),
                 width=WIDTH, height=rows_height(split, "run"))




def dp_phase_chart(phases: pd.DataFrame) -> alt.Chart:
    """One DP step per device, bars coloured by phase (`frames.dp_phase_frame`, ms from the
    step start)."""
    # no step number in the title: the spec stays the same from one Live refresh to the next,
    # so Streamlit keeps the view (and a tooltip on screen); the panel's caption names the step
    return alt.Chart(phases).mark_bar(height=alt.RelativeBandSize(0.7), stroke="white",
                                      strokeWidth=0.5).encode(
        x=alt.X("start_ms:Q", title="ms from step start"), x2="end_ms:Q",
        y=alt.Y("device:N", title="device"),
        color=alt.Color("phase:N", legend=alt.Legend(title="phase", orient="right", columns=2),
                        scale=alt.Scale(domain=DP_PHASES, range=PHASE_COLOURS), sort=DP_PHASES),
        tooltip=[alt.Tooltip("device:N"), alt.Tooltip("phase:N"),
                 alt.Tooltip("dur_ms:Q", title="duration (ms)", format=".2f"),
                 alt.Tooltip("nbytes:Q", title="bytes copied", format=",")],
    ).properties(title=title("DP phases", "latest step: device 0 alone broadcasts, reduces and steps"),
                 width=WIDTH, height=max(230, rows_height(phases, "device")))  # 4 legend rows


def comm_volume_chart(volume: pd.DataFrame) -> alt.Chart:
    """MiB each device sent + received in the latest step (measured or derived, as its events
    say: `frames.comm_volume_frame`'s `source`) beside the theory."""
    which = list(volume["source"]) if "source" in volume else ["measured"] * len(volume)
    long = pd.DataFrame({
        "device": list(volume["device"]) * 2,
        "which": which + ["theory"] * len(volume),
        "mib": list(volume["sent_mib"] + volume["recv_mib"])
        + list(volume["theory_sent_mib"] + volume["theory_recv_mib"])})
    colours = {"measured": "#1f77b4", "derived (ring all-reduce)": "#9467bd", "theory": "#c7c7c7",
               frames.UNLABELLED: "#ff9896"}
    kinds = [k for k in colours if k in set(long["which"])]
    return alt.Chart(long).mark_bar().encode(
        x=alt.X("mib:Q", title="sent + received per step (MiB)"),
        y=alt.Y("device:N", title="device"),
        yOffset=alt.YOffset("which:N", sort=kinds),
        color=alt.Color("which:N", legend=legend("bytes"),
                        scale=alt.Scale(domain=kinds, range=[colours[k] for k in kinds])),
        tooltip=[alt.Tooltip("device:N"), alt.Tooltip("which:N"),
                 alt.Tooltip("mib:Q", title="MiB", format=".3f")],
    ).properties(title=title("Bytes moved per device", "latest step, beside the theory"),
                 width=WIDTH, height=rows_height(volume, "device") + 20)
