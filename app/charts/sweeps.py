"""Chart builders of the Sweeps page (pure: `DataFrame -> alt.Chart`)."""

from __future__ import annotations

import altair as alt
import pandas as pd

from ddpviz.app.charts.style import HEIGHT, MODE_COLOURS, SWEEP_HUES, WIDTH, extra_title_px, legend, title

_MODE_RANGE = dict(zip(MODE_COLOURS.domain, MODE_COLOURS.range))  # the app's colour of each mode


def _modes_drawn(df: pd.DataFrame) -> alt.Scale:
    """The app's mode colours for the modes `df` has only: the legend names what is drawn (it listed fsdp
    beside a sweep with no FSDP run)."""
    present = [m for m in MODE_COLOURS.domain if m in set(df["mode"])]
    return alt.Scale(domain=present, range=[_MODE_RANGE[m] for m in present])
_WHICH = alt.Scale(domain=list(SWEEP_HUES), range=list(SWEEP_HUES.values()))


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
        color=alt.Color("mode:N", legend=legend("mode"), scale=_modes_drawn(eff)), tooltip=tip)
    ideal = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(strokeDash=[5, 4],
                                                            color="#555").encode(y="y:Q")
    head = title("Scaling efficiency vs world size",
                 "samples/s(n) ÷ (n · samples/s of one device); dashed: linear scaling" + _above_linear(eff))
    # room for the subtitle's lines: under Streamlit's autosize "fit" they cut the title and squeezed the plot
    return alt.layer(lines, ideal).properties(title=head, width=WIDTH, height=HEIGHT + extra_title_px(head))


SUSPECT_EFFICIENCY = 1.5  # above this share of linear, look at the baseline first (as Scale-out's clamp)


def _above_linear(eff: pd.DataFrame) -> str:
    """Where runs sit far above linear, the words that send the reader to the single-device baseline every
    efficiency divides by: a baseline slowed while it ran (e.g. beside the sweep's other runs on the same
    cores) raises them all."""
    high = eff[eff["efficiency"] > SUSPECT_EFFICIENCY]
    single = eff.loc[eff["mode"] == "single", "samples_per_s"]
    if high.empty or single.empty:
        return ""
    return (f"; {len(high)} run(s) above {SUSPECT_EFFICIENCY:.0%} (up to {high['efficiency'].max():.0%}): check the "
            f"one-device baseline ({float(single.iloc[0]):,.0f} samples/s), slow if it ran beside other runs")


def throughput_vs_world_chart(eff: pd.DataFrame) -> alt.Chart:
    """Samples/s vs world size, a line per mode."""
    return alt.Chart(eff).mark_line(strokeWidth=2, point=alt.OverlayMarkDef(size=70)).encode(
        x=alt.X("world_size:Q", title="world size (devices)",
                axis=alt.Axis(tickMinStep=1, format="d")),
        y=alt.Y("samples_per_s:Q", title="samples/s (median)"),
        color=alt.Color("mode:N", legend=legend("mode"), scale=_modes_drawn(eff)),
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


def shape_gil_chart(shapes: pd.DataFrame) -> alt.LayerChart:
    """DDP ÷ DP samples/s against DP's measured GIL share, one labelled point per model shape
    (`app.frames.sweeps.shape_frame`); dashed: DDP as fast as DP."""
    x = alt.X("dp_gil_share:Q", title="DP device threads' GIL wait (share of the step, measured)",
              axis=alt.Axis(format="%"))
    y = alt.Y("ddp_over_dp:Q", title="DDP ÷ DP throughput (samples/s ratio)")
    tip = [alt.Tooltip("shape:N", title="width×depth"),
           alt.Tooltip("dp_gil_share:Q", title="DP GIL wait", format=".1%"),
           alt.Tooltip("ddp_gil_share:Q", title="DDP GIL wait", format=".1%"),
           alt.Tooltip("dp_samples_per_s:Q", title="DP samples/s", format=",.0f"),
           alt.Tooltip("ddp_samples_per_s:Q", title="DDP samples/s", format=",.0f"),
           alt.Tooltip("ddp_over_dp:Q", title="DDP ÷ DP", format=".2f")]
    base = alt.Chart(shapes).encode(x=x, y=y, tooltip=tip)
    points = base.mark_point(size=90, filled=True).encode(
        color=alt.Color("shape:N", legend=legend("model width×depth"), sort=list(shapes["shape"])))
    labels = base.mark_text(align="left", dx=8, fontSize=12).encode(text="shape:N")
    even = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(strokeDash=[5, 4], color="#555").encode(y="y:Q")
    return alt.layer(even, points, labels).properties(
        title=title("GIL wait and DDP ÷ DP, per model shape",
                    "one point per shape: DP's measured GIL wait against DDP ÷ DP samples/s; "
                    "dashed: DDP as fast as DP"),
        width=WIDTH, height=HEIGHT)


def shape_share_chart(shapes: pd.DataFrame) -> alt.Chart:
    """Measured GIL share of DP's and DDP's runs per model shape, side by side."""
    long = shapes.melt(id_vars=["shape"], value_vars=["dp_gil_share", "ddp_gil_share"], var_name="mode",
                       value_name="share")
    long["mode"] = long["mode"].map({"dp_gil_share": "dp", "ddp_gil_share": "ddp"})
    return alt.Chart(long).mark_bar().encode(
        x=alt.X("shape:N", title="model width×depth", sort=list(shapes["shape"]), axis=alt.Axis(labelAngle=0)),
        xOffset=alt.XOffset("mode:N"),
        y=alt.Y("share:Q", title="GIL wait (share of the step, median)", axis=alt.Axis(format="%")),
        color=alt.Color("mode:N", legend=legend("mode"), sort=["dp", "ddp"],
                        scale=alt.Scale(domain=["dp", "ddp"], range=[_MODE_RANGE["dp"], _MODE_RANGE["ddp"]])),
        tooltip=[alt.Tooltip("shape:N"), alt.Tooltip("mode:N"), alt.Tooltip("share:Q", format=".1%")],
    ).properties(title=title("GIL wait per model shape",
                             "mean over devices of each run's median share (schedstat, measured)"),
                 width=WIDTH, height=HEIGHT)
