"""Chart builders of the Scale-out page (pure: `DataFrame -> alt.Chart`).

Predictions are lines named "DP (predicted)" / "DDP (predicted)"; real runs are filled points
named "... (measured)" drawn on top. Every title says "predicted".
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from ddpviz.app.charts.buckets import EXPOSED_NOTE, bucket_timeline
from ddpviz.app.charts.style import HEIGHT, MODE_HUES, WIDTH, extra_title_px, legend, title

SERIES = ["DP (predicted)", "DDP (predicted)", "DP (measured)", "DDP (measured)"]
_DP, _DDP = MODE_HUES["dp"][0], MODE_HUES["ddp"][0]  # one colour per mode, every page
_SERIES = alt.Scale(domain=SERIES, range=[_DP, _DDP, _DP, _DDP])
_X = alt.X("world_size:Q", title="world size (devices)", scale=alt.Scale(type="log", base=2),
           axis=alt.Axis(values=[1, 2, 4, 8, 16, 32, 64], format="d"))


def _lines_and_points(pred: pd.DataFrame, measured: pd.DataFrame, y: alt.Y, fmt: str) -> list:
    # the legend names only what is drawn: a series without rows (no DP run in the set, no measured points) is left out
    present = set(pred["series"]) | set(measured["series"])
    shown = [(s, hue) for s, hue in zip(SERIES, [_DP, _DDP, _DP, _DDP]) if s in present]
    scale = alt.Scale(domain=[s for s, _ in shown], range=[hue for _, hue in shown])
    color = alt.Color("series:N", legend=legend("", orient="bottom", columns=2), scale=scale)
    # the legend's symbols as drawn: an open circle for a predicted point, a filled diamond for a measured
    # one (one legend: Vega-Lite merges the colour and shape legends of one field and title)
    shape = alt.Shape("series:N", legend=legend("", orient="bottom", columns=2), scale=alt.Scale(
        domain=[s for s, _ in shown], range=["diamond" if "measured" in s else "circle" for s, _ in shown]))
    tip = [alt.Tooltip("series:N", title="what"), alt.Tooltip("world_size:Q", title="devices"),
           alt.Tooltip("nnodes:Q", title="hosts"),
           alt.Tooltip(f"{y.shorthand.split(':')[0]}:Q", format=fmt),
           alt.Tooltip("step_time_ms:Q", title="step (ms)", format=".3f")]
    # predicted points filled like their legend symbols (a legend draws every point symbol filled)
    layers = [alt.Chart(pred).mark_line(strokeWidth=2, strokeDash=[6, 3],
                                        point=alt.OverlayMarkDef(size=30, filled=True)).encode(
        x=_X, y=y, color=color, shape=shape, tooltip=tip)]
    if not measured.empty:
        layers.append(alt.Chart(measured).mark_point(size=120, filled=True, opacity=0.9).encode(
            x=_X, y=y, color=color, shape=shape, tooltip=tip + [alt.Tooltip("run_id:N")]))
    return layers


def predicted_throughput_chart(pred: pd.DataFrame, measured: pd.DataFrame, *, scenario: str) -> alt.LayerChart:
    """Predicted samples/s vs world size per mode (dashed), measured runs on top (diamonds)."""
    y = alt.Y("samples_per_s:Q", title="samples/s (log scale)", scale=alt.Scale(type="log"))
    return alt.layer(*_lines_and_points(pred, measured, y, ",.0f")).properties(
        title=title("Throughput vs world size (predicted)",
                    f"dashed: predicted for {scenario}{_dp_ends(pred)}"),
        width=WIDTH, height=HEIGHT + 60)


def _dp_ends(pred: pd.DataFrame) -> str:
    """Where DP's line stops short of DDP's, why (`engine.predict.scaleout.predict_dp`: one process drives
    the devices of one host)."""
    dp, ddp = pred[pred["mode"] == "dp"], pred[pred["mode"] == "ddp"]
    if dp.empty or ddp.empty or dp["world_size"].max() >= ddp["world_size"].max():
        return ""
    return f"; DP ends at {int(dp['world_size'].max())} devices: one process drives one host's devices"


def efficiency_chart(pred: pd.DataFrame, measured: pd.DataFrame, *, scenario: str,
                     one_device: str = "one device's") -> alt.LayerChart:
    """Predicted scaling efficiency vs world size, linear (100%) dashed grey. Measured points
    (give an empty frame to leave them out) beyond 1.5x linear sit clamped at the top. `one_device`: the
    samples/s both series are divided by, in words (the subtitle's formula)."""
    top = max(1.2, float(pred["efficiency"].max()) if not pred.empty else 1.2)
    y = alt.Y("efficiency:Q", title="efficiency (% of linear)", axis=alt.Axis(format="%"),
              scale=alt.Scale(domain=[0, min(top, 1.5)], clamp=True))
    ideal = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(strokeDash=[2, 2], color="#777").encode(y="y:Q")
    drawn = measured.dropna(subset=["efficiency"])
    layers = _lines_and_points(pred, drawn, y, ".0%")
    unmeasured = "" if drawn.empty == measured.empty else \
        "; no measured points: they need the set's single-device run (one device's measured samples/s)"
    above = drawn[drawn["efficiency"] > min(top, 1.5)]
    if not above.empty:  # clamped at the top edge: say so, with the highest, so none reads as ~1.5x
        unmeasured += (f"; {len(above)} measured point(s) above the axis sit at its top edge (up to "
                       f"{above['efficiency'].max():.0%}: a slow single-device baseline, e.g. a short run)")
    head = title("Scaling efficiency (predicted)",
                 f"samples/s(n) ÷ (n · {one_device}); grey: linear; for {scenario}{unmeasured}{_dp_ends(pred)}")
    # room for the subtitle's lines (the clamp's note makes 4-5): under Streamlit's autosize "fit" they pushed the
    # title out of the box and squeezed the plot (seen in Chromium)
    return alt.layer(*layers, ideal).properties(title=head, width=WIDTH, height=HEIGHT + 60 + extra_title_px(head))


def bytes_chart(df: pd.DataFrame) -> alt.Chart:
    """Bytes per step on the busiest device (predicted): DP's device 0 vs a DDP rank, n >= 2 (at
    n = 1 nothing moves, and the axis is logarithmic)."""
    df = df[df["busiest_bytes"] > 0]
    return alt.Chart(df).mark_line(strokeWidth=2, strokeDash=[6, 3], point=alt.OverlayMarkDef(size=30)).encode(
        x=_X, y=alt.Y("mib:Q", title="MiB per step (sent + received)", scale=alt.Scale(type="log")),
        color=alt.Color("series:N", legend=legend("", orient="bottom"),
                        scale=alt.Scale(domain=SERIES[:2], range=[_DP, _DDP])),
        tooltip=[alt.Tooltip("series:N", title="what"), alt.Tooltip("world_size:Q", title="devices"),
                 alt.Tooltip("mib:Q", title="MiB (sent + received)", format=".3f"),
                 alt.Tooltip("busiest_bytes:Q", title="bytes", format=",.0f")],
    ).properties(title=title("Where the star breaks (predicted)",
                             "bytes on the busiest device. DP: device 0 moves (n−1)·P each way; DDP: each rank 2(n−1)/n·P each way"),
                 width=WIDTH, height=HEIGHT + 60)


def predicted_timeline(buckets: pd.DataFrame, backward: pd.DataFrame, exposed: pd.DataFrame, *,
                       world_size: int, link: str) -> alt.LayerChart:
    """One predicted DDP step at `world_size`, drawn as the Bucket timeline page draws a
    measured one (`app.charts.buckets.bucket_timeline`), titled "predicted"."""
    chart = bucket_timeline(buckets, backward, exposed, run="predicted")
    n = int(buckets["bucket_index"].max()) + 1 if not buckets.empty else 0
    return chart.properties(title=title(
        f"Predicted buckets: DDP at world size {world_size}",
        f"predicted on {link}; {n} bucket(s); {EXPOSED_NOTE} (predicted)"))
