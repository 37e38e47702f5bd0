"""Chart builders for FSDP runs (pure: `DataFrame -> alt.Chart`), from `app.frames.fsdp`.

- `unit_timeline_chart`: the Live page's "FSDP unit timeline" — per rank, the forward and
  backward passes and every unit's all-gather and reduce-scatter on one time axis.
- `memory_curve_chart`: one rank's memory inside one step, stacked by kind.
- `shard_chart`: the Learn page's third picture — shards, gather, scatter.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from ddpviz.app.charts.style import CHROME_PX, FSDP_HUES, HEIGHT, WIDTH, legend, title
from ddpviz.app.frames.fsdp import KINDS, LANES, MEMORY_KINDS, SHARD_ROLES

PASS_KINDS = ["forward pass", "backward pass"]
_TIMELINE = alt.Scale(domain=PASS_KINDS + KINDS, range=[FSDP_HUES[k] for k in PASS_KINDS + KINDS])
_MEMORY = alt.Scale(domain=MEMORY_KINDS, range=[FSDP_HUES[k] for k in MEMORY_KINDS])
_ROLES = alt.Scale(domain=SHARD_ROLES, range=[FSDP_HUES[k] for k in SHARD_ROLES])
LANE_PX = 26  # one sub-row (compute, all-gather, reduce-scatter) of a rank's lane


def unit_timeline_chart(collectives: pd.DataFrame, passes: pd.DataFrame, run: str = "") -> alt.LayerChart:
    """One FSDP step per rank: pass spans behind, a bar per collective in its own sub-row.

    `collectives` is `app.frames.fsdp.collective_frame`, `passes` is `app.frames.fsdp.pass_frame`
    (both ms from the step's forward start)."""
    y = alt.Y("rank:O", title="rank")
    off = alt.YOffset("lane:N", sort=LANES, scale=alt.Scale(domain=LANES))
    colour = alt.Color("kind:N", legend=legend("", orient="bottom", columns=3), scale=_TIMELINE)
    p = passes.assign(kind=passes["phase"].map({"forward": PASS_KINDS[0], "backward": PASS_KINDS[1]}))
    bands = alt.Chart(p).mark_bar(height=alt.RelativeBandSize(0.9), opacity=0.9).encode(
        x=alt.X("start_ms:Q", title="ms from the step's forward start"), x2="end_ms:Q", y=y, yOffset=off,
        color=colour, tooltip=[alt.Tooltip("rank:O"), alt.Tooltip("kind:N"),
                               alt.Tooltip("start_ms:Q", format=".2f"), alt.Tooltip("end_ms:Q", format=".2f")])
    tip = [alt.Tooltip("rank:O"), alt.Tooltip("unit:N"), alt.Tooltip("kind:N"),
           alt.Tooltip("nbytes:Q", title="bytes (full unit)", format=","),
           alt.Tooltip("shard_nbytes:Q", title="bytes (one shard)", format=","), alt.Tooltip("dtype:N"),
           alt.Tooltip("dur_ms:Q", title="duration (ms)", format=".3f")]
    comm = alt.Chart(collectives).mark_bar(height=alt.RelativeBandSize(0.8), stroke="white",
                                           strokeWidth=0.6).encode(
        x="start_ms:Q", x2="end_ms:Q", y=y, yOffset=off, color=colour, tooltip=tip)
    ranks = max(1, collectives["rank"].nunique() if not collectives.empty else 1)
    head = "FSDP unit timeline" + (f": {run}" if run else "")  # the step goes in the caption
    return alt.layer(bands, comm).properties(
        title=title(head, "per rank: each unit's collectives vs forward and backward; measured "
                          "(FSDP2 comm hooks)"),
        width=WIDTH, height=CHROME_PX + 60 + ranks * len(LANES) * LANE_PX)


def memory_curve_chart(curve: pd.DataFrame, run: str = "") -> alt.Chart:
    """One rank's memory inside one step, stacked by kind (`app.frames.fsdp.memory_curve_frame`)."""
    rank = int(curve["rank"].iloc[0]) if not curve.empty else 0
    head = f"Memory by kind within a step, rank {rank}"  # the step goes in the caption
    return alt.Chart(curve).mark_area(interpolate="step-after", opacity=0.85).encode(
        x=alt.X("t_ms:Q", title="ms from step start"),
        y=alt.Y("sum(mib):Q", title="MiB held (tensors alive)", stack="zero"),
        color=alt.Color("kind:N", legend=legend("measured: tensors alive"), scale=_MEMORY, sort=MEMORY_KINDS),
        order=alt.Order("kind_order:Q"),
        tooltip=[alt.Tooltip("label:N", title="point"), alt.Tooltip("kind:N"),
                 alt.Tooltip("mib:Q", title="MiB", format=".3f"),
                 alt.Tooltip("rss_mib:Q", title="process RSS (MiB)", format=".1f")],
    ).transform_calculate(kind_order=f"indexof({MEMORY_KINDS}, datum.kind)").properties(
        title=title(head + (f": {run}" if run else ""),
                    "each unit's gathered parameters rise and fall; sampled at FSDP's hooks, "
                    "so it can miss what lives between them (the measured peak is in the caption)"),
        width=WIDTH, height=HEIGHT)


def shard_chart(shards: pd.DataFrame) -> alt.HConcatChart:
    """Three grids (rank x shard) of one unit: sharded, during the all-gather, during the
    reduce-scatter (`app.frames.fsdp.shard_frame`); each cell labelled with the measured shard MiB."""
    unit = shards["unit"].iloc[0] if not shards.empty else "?"
    panels = []
    heads = {"sharded": "between steps: each rank holds its own shard",
             "all-gather": "all-gather: each rank receives the others' shards",
             "reduce-scatter": "reduce-scatter: each keeps its averaged shard"}
    for picture, sub in heads.items():
        df = shards[shards["picture"] == picture]
        x = alt.X("slice:N", title="shard of the unit", axis=alt.Axis(labelAngle=0, labelOverlap=False))
        y = alt.Y("holder:N", title="held by")
        cells = alt.Chart(df).mark_rect(stroke="white", strokeWidth=2).encode(
            x=x, y=y, color=alt.Color("role:N", legend=legend("", orient="bottom", columns=3), scale=_ROLES),
            tooltip=[alt.Tooltip("holder:N"), alt.Tooltip("slice:N"), alt.Tooltip("role:N"),
                     alt.Tooltip("mib:Q", title="MiB (measured)", format=".3f")])
        dark = alt.condition(alt.FieldOneOfPredicate(field="role", oneOf=[SHARD_ROLES[2]]),
                             alt.value("#333333"), alt.value("white"))  # dark text on the pale cells
        text = alt.Chart(df[df["role"] != SHARD_ROLES[4]]).mark_text(fontSize=11).encode(
            x=x, y=y, text=alt.Text("mib:Q", format=".2f"), color=dark)
        panels.append(alt.layer(cells, text).properties(title=title(picture, sub), width=200, height=200))
    return alt.hconcat(*panels).properties(
        title=title(f"Shards, gather, scatter: unit '{unit}'",
                    "cells: one shard, labelled with the MiB the run's collectives measured"))
