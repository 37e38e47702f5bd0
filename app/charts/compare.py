"""Chart builders of the Compare page (pure: `DataFrame -> alt.Chart`).

Inputs are `app.frames.compare` outputs. Runs are coloured by their mode (`run_scale`), bars of
measured, derived and formula by a fixed colour scale, so the same run reads the same on every
chart.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from ddpviz.app.charts.style import HEIGHT, STEP_X, WIDTH, legend, rows_height, run_scale, title, volume_scale
from ddpviz.app.frames.base import MIB
from ddpviz.engine.analysis import byte_unit, format_bytes
from ddpviz.app.frames.steps import VOLUME_KINDS as WHICH


def loss_chart(steps: pd.DataFrame, modes: dict[str, str] | None = None) -> alt.LayerChart:
    """Training loss per optimizer step, one line per run (`app.frames.steps.steps_frame` rows).

    Same config and seed: the curves should lie on top of each other, so each run's line is
    drawn thinner than, and above, the one before it: all stay visible where they coincide."""
    runs = list(dict.fromkeys(steps["run"])) or [""]
    colour = alt.Color("run:N", legend=legend("run"), scale=run_scale(runs, modes))  # as throughput
    tip = [alt.Tooltip("run:N"), alt.Tooltip("step:Q"), alt.Tooltip("loss:Q", format=".4f")]
    y = alt.Y("loss:Q", title="loss (cross-entropy)", scale=alt.Scale(zero=False))
    layers = [alt.Chart(steps[steps["run"] == run]).mark_line(
        strokeWidth=max(1.5, 8.0 - 3.0 * i), opacity=min(1.0, 0.35 + 0.3 * i)).encode(
        x=STEP_X, y=y, color=colour, tooltip=tip) for i, run in enumerate(runs)]
    return alt.layer(*layers).properties(
        title=title("Loss per step", "same config and seed: the curves should nearly coincide; the modes sum "
                    "gradients in different orders, so float rounding can part them, slowly (drawn thick to thin "
                    "in legend order)"),
        width=WIDTH, height=HEIGHT)


def speedup_chart(compare: pd.DataFrame) -> alt.LayerChart:
    """Speed-up over the single-device run per run, with a tick at the ideal (= world size)."""
    df = compare.dropna(subset=["speedup_vs_single"]).assign(ideal=lambda d: d["world_size"])
    y = alt.Y("run:N", title="run", sort=list(df["run"]))
    colour = alt.Color("run:N", legend=legend("run"), scale=run_scale(list(df["run"]), dict(zip(df["run"], df["mode"]))))
    tip = [alt.Tooltip("run:N"), alt.Tooltip("speedup_vs_single:Q", title="speed-up", format=".2f"),
           alt.Tooltip("ideal:Q", title="ideal (world size)"),
           alt.Tooltip("samples_per_s:Q", title="samples/s", format=",.0f")]
    bars = alt.Chart(df).mark_bar(height=alt.RelativeBandSize(0.6)).encode(
        x=alt.X("speedup_vs_single:Q", title="speed-up over single (×)"), y=y, color=colour,
        tooltip=tip)
    ideal = alt.Chart(df.assign(what="ideal: world size ×")).mark_tick(
        thickness=3, size=26, color="black").encode(
        x="ideal:Q", y=y, shape=alt.Shape("what:N", legend=legend("")), tooltip=tip)
    one = alt.Chart(pd.DataFrame({"x": [1.0]})).mark_rule(strokeDash=[4, 3], color="#888").encode(
        x="x:Q")
    return alt.layer(bars, ideal, one).properties(
        title=title("Speed-up over one device", "median samples/s ÷ the single run's; "
                    "black tick: linear scaling"),
        width=WIDTH, height=rows_height(df, "run"))


def _in_unit(df: pd.DataFrame, mib_col: str) -> tuple[pd.DataFrame, str, alt.Scale]:
    """`df` with `amount` (its `mib_col` in the unit that suits its largest value: B, KiB, MiB,
    GiB, `engine.analysis.byte_unit`) and `label` (each value written out, `format_bytes`: every
    bar says its number), the unit's name, and an x scale from 0 with room for the labels (never
    a degenerate [0, 0] domain, whose ticks read "0.000000", when every value is 0)."""
    nbytes = df[mib_col].fillna(0.0) * MIB
    unit, size = byte_unit(float(nbytes.max()) if len(nbytes) else 0.0)
    out = df.assign(amount=nbytes / size, label=[format_bytes(b) for b in nbytes])
    top = float(out["amount"].max()) if len(out) else 0.0
    return out, unit, alt.Scale(domain=[0, top * 1.25 if top > 0 else 1.0], nice=False)


def _labelled(bars: alt.Chart, x: str, y: alt.Y, **offset) -> alt.LayerChart:
    """`bars` with each bar's `label` written just past its end (in ink: the bars' colour scale
    stays the chart's one, with its legend)."""
    text = alt.Chart(bars.data).mark_text(align="left", baseline="middle", dx=4, fontSize=11,
                                          color="#333333").encode(x=x, y=y, text="label:N", **offset)
    return alt.layer(bars, text)


def peak_memory_chart(peaks: pd.DataFrame, modes: dict[str, str] | None = None) -> alt.LayerChart:
    """Peak memory per device, runs one under the other (`app.frames.compare.peak_memory_frame`),
    in the unit that suits the largest peak, each bar labelled with its bytes."""
    df, unit, scale = _in_unit(peaks.assign(where=peaks["run"] + " · " + peaks["device"]), "peak_mib")
    y = alt.Y("where:N", title="run · device", sort=list(dict.fromkeys(df["where"])), axis=alt.Axis(labelLimit=0))
    bars = alt.Chart(df).mark_bar(height=alt.RelativeBandSize(0.7)).encode(
        x=alt.X("amount:Q", title=f"measured peak ({unit})", scale=scale), y=y,
        color=alt.Color("run:N", legend=legend("run"), scale=run_scale(list(df["run"]), modes)),
        tooltip=[alt.Tooltip("run:N"), alt.Tooltip("device:N"), alt.Tooltip("label:N", title="peak")])
    head = title("Peak memory per device", "largest bytes each device held in a traced step (live tensors on CPU, "
                 "the CUDA allocator on GPU); an FSDP rank holds 1/n of the model plus the unit it has gathered")
    return _labelled(bars, "amount:Q", y).properties(
        title=head, width=WIDTH, height=rows_height(df, "where", row_px=34, title_params=head) + 24)


def bytes_chart(volume: pd.DataFrame) -> alt.LayerChart:
    """Sent + received MiB per device per step, for each run (`app.frames.compare.bytes_frame`):
    measured (DP: the tensors copied), derived (DDP: bytes handed to all-reduce × the ring
    factor; FSDP: collective bytes × the wire factor) or unlabelled (no `volume_source`), as each
    event says, beside the formula."""
    df, unit, scale = _in_unit(volume.assign(where=volume["run"] + " · " + volume["device"]), "mib")
    y = alt.Y("where:N", title="run · device", sort=list(dict.fromkeys(df["where"])), axis=alt.Axis(labelLimit=0))
    offset = dict(yOffset=alt.YOffset("which:N", sort=WHICH))
    bars = alt.Chart(df).mark_bar().encode(
        x=alt.X("amount:Q", title=f"sent + received per step ({unit})", scale=scale), y=y, **offset,
        color=alt.Color("which:N", legend=legend("bytes"), scale=volume_scale(df["which"])),
        tooltip=[alt.Tooltip("run:N"), alt.Tooltip("device:N"), alt.Tooltip("which:N"),
                 alt.Tooltip("label:N", title="bytes")])
    head = title("Bytes moved per device per step",
                 "theory: DP device 0 (n−1)·P each way, others P (parameters and gradients only: DP's measured "
                 "bytes also hold the inputs it scatters, the outputs it gathers and their gradients); ring "
                 "all-reduce 2(n−1)/n·P each way per rank; FSDP 3(n−1)/n·P (2(n−1)/n·P without reshard; on "
                 "gloo, which runs reduce-scatter as an all-reduce, its measured bytes exceed this by (n−1)/n·P)")
    return _labelled(bars, "amount:Q", y, **offset).properties(
        title=head, width=WIDTH,
        height=rows_height(df, "where", row_px=34, title_params=head) + 10 * (df["which"].nunique() - 1))
