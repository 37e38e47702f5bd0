"""Chart builders of the Learn page: the star (DP) and the ring (DDP) as node/edge charts.

Edges are rules whose width grows with the MiB the link carried per step (size legend); nodes
are coloured by role. The plot is square with hidden axes: positions come from
`app.frames.topology` on a unit circle.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from ddpviz.app.charts.style import CHROME_PX, MODE_HUES, WIDTH, extra_title_px, legend, stacked_legends, title
from ddpviz.app.frames.topology import ROLES

SIZE_PX = 430  # square plot: a circle must stay a circle
# Learn draws these three to a row (star, ring, tree): a third of a page column, whose title Vega
# cuts at ~220 px at 1280 px wide (seen in Chromium), so titles wrap at (title, subtitle) characters
# that fit it (`app.charts.style.title`)
THIRD_COLUMN_CHARS = (28, 41)
# DP's hub and replicas in DP's colours (the hub its dark shade), DDP's ranks in DDP's
_ROLE_HUE = dict(zip(ROLES, [MODE_HUES["dp"][1], MODE_HUES["dp"][0], MODE_HUES["ddp"][0]]))


def _role(nodes: pd.DataFrame) -> alt.Color:
    """Node colour by role, the legend listing only the roles drawn (a ring has no hub or replicas)."""
    present = [r for r in ROLES if r in set(nodes["role"])] or ROLES
    return alt.Color("role:N", legend=legend("node", orient="bottom", direction="vertical"),
                     scale=alt.Scale(domain=present, range=[_ROLE_HUE[r] for r in present]))
_AXIS = dict(axis=None, scale=alt.Scale(domain=[-1.45, 1.45]))


def topology_chart(nodes: pd.DataFrame, edges: pd.DataFrame, *, heading: str,
                   subtitle: str, max_mib: float | None = None, arrows: bool = False
                   ) -> alt.LayerChart:
    """Nodes and links; `max_mib` shares the width scale between two charts shown together."""
    top = max_mib or (float(edges["mib"].max()) if not edges.empty else 1.0) or 1.0
    width = alt.Size("mib:Q", title="MiB per step on the link",
                     scale=alt.Scale(domain=[0, top], range=[1, 14]),
                     legend=alt.Legend(orient="bottom", symbolType="stroke", tickCount=3,
                                       direction="horizontal"))
    tip = [alt.Tooltip("link:N"), alt.Tooltip("mib:Q", title="MiB per step", format=".3f")]
    links = alt.Chart(edges).mark_rule(color="#7f7f7f", opacity=0.85).encode(
        x=alt.X("x:Q", **_AXIS), y=alt.Y("y:Q", **_AXIS), x2="x2:Q", y2="y2:Q",
        strokeWidth=width, tooltip=tip)
    labels = alt.Chart(edges).mark_text(fontSize=12, color="#333").encode(
        x=alt.X("lx:Q", **_AXIS), y=alt.Y("ly:Q", **_AXIS), text="label:N", tooltip=tip)
    layers = [links, labels]
    if arrows:  # a ▶ glyph turned along the link (it points right, i.e. bearing 90°)
        layers.append(alt.Chart(edges.assign(turn=(edges["angle"] - 90) % 360)).mark_text(
            text="▶", fontSize=20, color="#333").encode(
            x=alt.X("ax:Q", **_AXIS), y=alt.Y("ay:Q", **_AXIS),
            angle=alt.Angle("turn:Q", scale=None), tooltip=tip))
    dots = alt.Chart(nodes).mark_circle(size=900, opacity=1, stroke="white",
                                        strokeWidth=2).encode(
        x=alt.X("x:Q", **_AXIS), y=alt.Y("y:Q", **_AXIS), color=_role(nodes),
        tooltip=[alt.Tooltip("label:N", title="node"), alt.Tooltip("role:N")])
    names = alt.Chart(nodes).mark_text(fontSize=13, fontWeight="bold", dy=28).encode(
        x=alt.X("x:Q", **_AXIS), y=alt.Y("y:Q", **_AXIS), text="label:N")
    # the link widths' legend above the nodes', never beside it: side by side they need ~330 px
    chart = alt.layer(*layers, dots, names).properties(
        title=title(heading, subtitle, chars=THIRD_COLUMN_CHARS), width=SIZE_PX, height=SIZE_PX,
        autosize=alt.AutoSizeParams(type="pad"))  # legends around the square, not inside it
    return stacked_legends(chart, "bottom")


def allreduce_time_chart(frame: pd.DataFrame, *, subtitle: str, mark_n: int | None = None) -> alt.LayerChart:
    """Time of one all-reduce against world size, ring and tree (theory), log2 x axis; a rule
    at `mark_n` (the chosen world size)."""
    x = alt.X("world_size:Q", title="world size n (ranks)", scale=alt.Scale(type="log", base=2),
              axis=alt.Axis(values=sorted(frame["world_size"].unique().tolist()) if not frame.empty else None))
    lines = alt.Chart(frame).mark_line(point=True).encode(
        x=x, y=alt.Y("time_ms:Q", title="one all-reduce of P (ms, theory)"),
        color=alt.Color("model:N", title="all-reduce model", legend=legend("all-reduce model")),
        tooltip=[alt.Tooltip("world_size:Q", title="n"), alt.Tooltip("model:N"),
                 alt.Tooltip("time_ms:Q", title="ms", format=".4f")])
    layers = [lines]
    if mark_n is not None:
        layers.append(alt.Chart(pd.DataFrame({"world_size": [mark_n]})).mark_rule(
            strokeDash=[4, 3], color="#555").encode(x="world_size:Q"))
    t = title("Ring vs tree: one all-reduce (theory)", subtitle)
    # room for every subtitle line: a long one (the fitted link's words) squashed the plot and cut the title
    return alt.layer(*layers).properties(title=t, width=WIDTH, height=260 + CHROME_PX + extra_title_px(t))
