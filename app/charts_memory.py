"""The memory chart: one traced step, as it happened (`app.frames_memory` inputs).

Top: where the phases fall (device 0 / rank 0). Middle: the bytes each device holds through the
step (live tensors on CPU, the CUDA allocator on GPU), so activations rise in forward and fall in
backward, and DP's device 0 shows the gather and the reduce. Bottom: the whole process (RSS) or
the whole GPU (NVML), which include what is not a tensor (the interpreter, libraries, the CUDA
context). Every line's `source` is in the legend.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from app.chart_style import CATEGORIES, PHASE_COLOURS, WIDTH, legend, title
from app.frames import DP_PHASES
from app.frames_memory import DEVICE_SOURCES, HOST_SOURCES, SOURCE_LABELS

_DASHES = alt.Scale(domain=[SOURCE_LABELS[s] for s in (*DEVICE_SOURCES, *HOST_SOURCES)],
                    range=[[1, 0], [6, 3], [2, 2], [1, 0]])
_X = alt.X("t_ms:Q", title="ms from the step's start")


def memory_curve_chart(curve: pd.DataFrame, phases: pd.DataFrame, run: str,
                       y_max_mib: float | None = None) -> alt.VConcatChart:
    """One run's traced step: phases, device curves, process/GPU curves (those present).

    Pass the same `y_max_mib` to runs shown side by side so their device curves compare."""
    step = int(curve["step"].iloc[0]) if not curve.empty else None
    where = curve[curve["source"].isin(DEVICE_SOURCES)]
    host = curve[curve["source"].isin(HOST_SOURCES)]
    head = f"Memory within step {step}: {run}" if step is not None else f"Memory within a step: {run}"
    parts = []
    if not phases.empty:
        parts.append(_phase_strip(phases).properties(
            title=_small("phases of device 0 / rank 0 (DP: measured spans; DDP, single: placed "
                         "from the step's measured durations)"), width=WIDTH, height=34))
    parts.append(_lines(where, "bytes held (MiB)", y_max_mib).properties(
        title=_small("what each device holds (line style = source)"), width=WIDTH, height=200))
    if not host.empty:
        parts.append(_lines(host, "MiB", None, zero=False).properties(
            title=_small("the whole process (RSS) or the whole GPU (NVML): includes what is not "
                         "a tensor"), width=WIDTH, height=110))
    return alt.vconcat(*parts).properties(
        title=title(head, "measured in the run; one traced step, ms from its start")
    ).resolve_scale(x="shared", color="independent", strokeDash="independent")


def _small(text: str) -> alt.TitleParams:
    return alt.TitleParams(text=text, fontSize=11, fontWeight="normal", anchor="start")


def _lines(df: pd.DataFrame, y_title: str, y_max: float | None, zero: bool = True) -> alt.Chart:
    scale = alt.Scale(domain=[0, y_max], nice=True) if y_max else alt.Scale(zero=zero)
    return alt.Chart(df).mark_line(interpolate="step-after", strokeWidth=2,
                                   point=alt.OverlayMarkDef(size=6, opacity=0.5)).encode(
        x=_X, y=alt.Y("mib:Q", title=y_title, scale=scale),
        color=alt.Color("device:N", legend=legend("device"), scale=CATEGORIES),
        strokeDash=alt.StrokeDash("source_label:N", legend=legend("source", symbolType="stroke"),
                                  scale=_DASHES),
        detail="source:N",
        tooltip=[alt.Tooltip("device:N"), alt.Tooltip("source_label:N", title="source"),
                 alt.Tooltip("t_ms:Q", title="ms from step start", format=".2f"),
                 alt.Tooltip("mib:Q", title="MiB", format=".2f")])


def _phase_strip(phases: pd.DataFrame) -> alt.Chart:
    return alt.Chart(phases).mark_bar(height=alt.RelativeBandSize(0.9), stroke="white",
                                      strokeWidth=0.5).encode(
        x=alt.X("start_ms:Q", title=None), x2="end_ms:Q",
        color=alt.Color("phase:N", legend=alt.Legend(title="phase", orient="right", columns=2),
                        scale=alt.Scale(domain=DP_PHASES, range=PHASE_COLOURS), sort=DP_PHASES),
        tooltip=[alt.Tooltip("phase:N"), alt.Tooltip("start_ms:Q", title="start (ms)", format=".2f"),
                 alt.Tooltip("end_ms:Q", title="end (ms)", format=".2f")])
