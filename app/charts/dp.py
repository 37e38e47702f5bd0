"""Chart builders of the DP timeline page (pure: `DataFrame -> alt.Chart`).

Phases keep the Live page's colours (`app.charts.style.PHASE_COLOURS`); idle
gaps are drawn as pale hatched-looking bars with the device's idle share written beside its lane.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from app.charts.style import PHASE_COLOURS, WIDTH, legend, rows_height, title
from app.frames.dp import DP_PHASES

IDLE = "idle (waiting)"
_DOMAIN, _RANGE = DP_PHASES + [IDLE], PHASE_COLOURS + ["#f2f2f2"]
_PHASE = alt.Color("phase:N", legend=legend("phase", orient="bottom", columns=5),
                   scale=alt.Scale(domain=_DOMAIN, range=_RANGE), sort=_DOMAIN)
_PHASE_ONLY = alt.Color("phase:N", legend=legend("phase", columns=1),
                        scale=alt.Scale(domain=DP_PHASES, range=PHASE_COLOURS), sort=DP_PHASES)
LEGEND_PX = 80  # the timeline's legend below the plot (two rows)


def dp_timeline(phases: pd.DataFrame, idle: pd.DataFrame, summary: pd.DataFrame, *,
                run: str) -> alt.LayerChart:
    """One DP step per device: phases (`app.frames.dp.dp_phase_frame`), idle gaps
    (`app.frames.dp.idle_frame`) and each device's idle share (`app.frames.dp.idle_summary`)."""
    step = int(phases["step"].iloc[0]) if not phases.empty else None
    devices = sorted(phases["device"].unique()) if not phases.empty else []
    y = alt.Y("device:N", title="device", sort=devices)
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
    return alt.layer(gaps, bars, text).properties(
        title=title(label, "device 0 broadcasts, reduces and steps while the others wait"),
        width=WIDTH, height=rows_height(phases, "device", row_px=56) + LEGEND_PX)


def phase_totals_chart(totals: pd.DataFrame, *, run: str) -> alt.Chart:
    """Median ms per step each device spends in each phase (`app.frames.dp.phase_totals`)."""
    return alt.Chart(totals).mark_bar(height=alt.RelativeBandSize(0.6)).encode(
        x=alt.X("sum(ms):Q", title="median time per step (ms)", stack="zero"),
        y=alt.Y("device:N", title="device"),
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
        y=alt.Y("device:N", title="device"),
        color=alt.Color("phase:N", legend=alt.Legend(title="phase", orient="right", columns=2),
                        scale=alt.Scale(domain=DP_PHASES, range=PHASE_COLOURS), sort=DP_PHASES),
        tooltip=[alt.Tooltip("device:N"), alt.Tooltip("phase:N"),
                 alt.Tooltip("dur_ms:Q", title="duration (ms)", format=".2f"),
                 alt.Tooltip("nbytes:Q", title="bytes copied", format=",")],
    ).properties(title=title("DP phases", "latest step: device 0 alone broadcasts, reduces and steps"),
                 width=WIDTH, height=max(230, rows_height(phases, "device")))  # 4 legend rows
