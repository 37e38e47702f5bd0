"""Chart builders of the Theory page (pure: `DataFrame -> alt.Chart`).

Bytes through each device (DP's hub vs DDP's ring) reuse `charts_compare.bytes_chart`.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from app.chart_style import HEIGHT, WIDTH, legend, title

_BW = alt.Scale(domain=["algbw", "busbw"], range=["#1f77b4", "#9edae5"])
_SERIES = ["measured (a bucket on a rank)", "fitted ring model"]


def bandwidth_chart(per_bucket: pd.DataFrame, *, run: str) -> alt.Chart:
    """Median algbw and busbw per bucket (`frames_theory.per_bucket`), GB/s."""
    return alt.Chart(per_bucket).mark_bar().encode(
        x=alt.X("bucket:O", title="bucket index (reduction order)", axis=alt.Axis(labelAngle=0)),
        xOffset=alt.XOffset("which:N", sort=["algbw", "busbw"]),
        y=alt.Y("gbps:Q", title="bandwidth (GB/s)"),
        color=alt.Color("which:N", legend=legend("measure"), scale=_BW),
        tooltip=[alt.Tooltip("bucket:O"), alt.Tooltip("kib:Q", title="size (KiB)", format=",.1f"),
                 alt.Tooltip("which:N"), alt.Tooltip("gbps:Q", title="GB/s", format=".3f")],
    ).properties(title=title(f"{run}: bandwidth per bucket",
                             "algbw = bytes / all-reduce time; busbw = algbw · 2(n−1)/n"),
                 width=WIDTH, height=HEIGHT)


def _y_top(measured: pd.Series, model: pd.Series) -> float:
    """Top of the time axis: room for most points and the whole fitted line, not for the
    rare straggler (a rank that arrived late) that would flatten everything else."""
    if measured.empty:
        return float(model.max()) if not model.empty else 1.0
    typical = float(measured.quantile(0.95)) * 1.5
    return max(typical, float(model.max()) if not model.empty else 0.0, 1e-3)


def ring_fit_chart(bw: pd.DataFrame, line: pd.DataFrame, *, run: str) -> alt.LayerChart:
    """Each bucket's all-reduce time against its size (`frames_theory.bandwidth_frame`), with
    the fitted line t = a + c·bytes (`frames_theory.ring_fit`)."""
    colour = alt.Color("series:N", legend=legend("", orient="bottom", labelLimit=320),
                       scale=alt.Scale(domain=_SERIES, range=["#1f77b4", "#d62728"]))
    x = alt.X("kib:Q", title="bucket size (KiB)")
    top = _y_top(bw["comm_ms"], line["predicted_ms"])
    clipped = int((bw["comm_ms"] > top).sum())
    y = alt.Y("comm_ms:Q", title="all-reduce time (ms)",
              scale=alt.Scale(domain=[0, top], clamp=True, nice=False))
    points = alt.Chart(bw.assign(series=_SERIES[0])).mark_circle(size=28, opacity=0.5).encode(
        x=x, y=y, color=colour,
        tooltip=[alt.Tooltip("step:Q"), alt.Tooltip("rank:Q"), alt.Tooltip("bucket_index:Q",
                                                                            title="bucket"),
                 alt.Tooltip("kib:Q", title="KiB", format=",.1f"),
                 alt.Tooltip("comm_ms:Q", title="ms", format=".3f")])
    fit = alt.Chart(line.assign(series=_SERIES[1])).mark_line(strokeWidth=2.5, clip=True).encode(
        x=x, y=alt.Y("predicted_ms:Q", scale=alt.Scale(domain=[0, top], clamp=True, nice=False)),
        color=colour,
        tooltip=[alt.Tooltip("kib:Q", title="KiB", format=",.1f"),
                 alt.Tooltip("predicted_ms:Q", title="model (ms)", format=".3f")])
    note = f"; {clipped} slow outlier(s) drawn at the top" if clipped else ""
    return alt.layer(points, fit).properties(
        title=title(f"{run}: all-reduce time vs bytes",
                    "service time (after the previous bucket); ring model t = 2(n−1)·α + "
                    f"2(n−1)/n · bytes/β{note}"),
        width=WIDTH, height=HEIGHT + 40)

