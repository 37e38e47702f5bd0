"""Chart builders of the Sweeps page (pure: `DataFrame -> alt.Chart`)."""

from __future__ import annotations

import altair as alt
import pandas as pd

from app.charts.style import HEIGHT, MODE_COLOURS, WIDTH, legend, title

_WHICH = alt.Scale(domain=["step time", "exposed comm"], range=["#1f77b4", "#d62728"])


def efficiency_chart(eff: pd.DataFrame) -> alt.LayerChart:
    """Scaling efficiency vs world size, a line per mode (`app.frames.sweeps.efficiency_frame`),
    with the ideal (1.0) dashed."""
    x = alt.X("world_size:Q", title="world size (devices)", axis=alt.Axis(tickMinStep=1,
                                                                          format="d"))
    tip = [alt.Tooltip("label:N", title="run"), alt.Tooltip("world_size:Q", title="devices"),
           alt.Tooltip("samples_per_s:Q", title="samples/s", format=",.0f"),
           alt.Tooltip("speedup:Q", title="speed-up", format=".2f"),
           alt.Tooltip("efficiency:Q", format=".0%")]
    lines = alt.Chart(eff).mark_line(strokeWidth=2, point=alt.OverlayMarkDef(size=70)).encode(
        x=x, y=alt.Y("efficiency:Q", title="efficiency (% of linear)",
                     axis=alt.Axis(format="%")),
        color=alt.Color("mode:N", legend=legend("mode"), scale=MODE_COLOURS), tooltip=tip)
    ideal = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(strokeDash=[5, 4],
                                                            color="#555").encode(y="y:Q")
    return alt.layer(lines, ideal).properties(
        title=title("Scaling efficiency vs world size",
                    "samples/s(n) ÷ (n · samples/s of one device); dashed: linear scaling"),
        width=WIDTH, height=HEIGHT)


def throughput_vs_world_chart(eff: pd.DataFrame) -> alt.Chart:
    """Samples/s vs world size, a line per mode."""
    return alt.Chart(eff).mark_line(strokeWidth=2, point=alt.OverlayMarkDef(size=70)).encode(
        x=alt.X("world_size:Q", title="world size (devices)",
                axis=alt.Axis(tickMinStep=1, format="d")),
        y=alt.Y("samples_per_s:Q", title="samples/s (median)"),
        color=alt.Color("mode:N", legend=legend("mode"), scale=MODE_COLOURS),
        tooltip=[alt.Tooltip("label:N", title="run"),
                 alt.Tooltip("samples_per_s:Q", title="samples/s", format=",.0f")],
    ).properties(title=title("Throughput vs world size", "median samples/s after warm-up"),
                 width=WIDTH, height=HEIGHT)


def bucket_sweep_chart(long: pd.DataFrame) -> alt.Chart:
    """Median step time and exposed comm vs bucket cap (`app.frames.sweeps.bucket_sweep_frame`),
    log-scaled caps."""
    return alt.Chart(long).mark_line(strokeWidth=2, point=alt.OverlayMarkDef(size=70)).encode(
        x=alt.X("bucket_cap_mb:Q", title="bucket_cap_mb (MiB, log scale)",
                scale=alt.Scale(type="log")),
        y=alt.Y("ms:Q", title="median per step (ms)"),
        color=alt.Color("which:N", legend=legend("measure"), scale=_WHICH),
        tooltip=[alt.Tooltip("label:N", title="run"),
                 alt.Tooltip("bucket_cap_mb:Q", title="cap (MiB)"), alt.Tooltip("which:N"),
                 alt.Tooltip("ms:Q", title="ms", format=".3f")],
    ).properties(title=title("Step time vs bucket size",
                             "small buckets: more all-reduce calls (latency); one huge bucket: "
                             "nothing overlaps backward"),
                 width=WIDTH, height=HEIGHT)
