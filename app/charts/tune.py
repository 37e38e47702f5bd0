"""Chart builder of the Tune page (pure: `DataFrame -> alt.Chart`): each setting's step time as a
ratio to the baseline's, measured (with its 90% interval) beside predicted, a dashed rule at 1.0."""

from __future__ import annotations

import altair as alt
import pandas as pd

from ddpviz.app.charts.style import CHROME_PX, ROW_PX, TUNE_HUES, WIDTH, legend, title
from ddpviz.app.frames.tune import MEASURED, PREDICTED

_SERIES = [MEASURED, PREDICTED]
_COLOUR = alt.Color("series:N", scale=alt.Scale(domain=_SERIES, range=[TUNE_HUES["measured"], TUNE_HUES["predicted"]]),
                    legend=legend("", orient="bottom", direction="vertical"))
_SHAPE = alt.Shape("series:N", scale=alt.Scale(domain=_SERIES, range=["circle", "diamond"]),
                   legend=legend("", orient="bottom", direction="vertical"))
LEGEND_PX = 50  # two legend rows below the plot
RULE_COLOUR = "#555555"  # the baseline's rule, as the Sweeps page's ideal line (not a series)


def ratio_chart(df: pd.DataFrame) -> alt.LayerChart:
    """Measured ratio (a dot and its interval's bar) and predicted ratio (a diamond) per setting
    (`app.frames.tune.ratio_frame`), one band each, in the report's order; the dashed rule at 1.0
    is the baseline: left of it a setting is faster."""
    order = list(dict.fromkeys(df["setting"]))
    y = alt.Y("setting:N", sort=order, title="setting", axis=alt.Axis(labelLimit=320))
    offset = alt.YOffset("series:N", sort=_SERIES, scale=alt.Scale(domain=_SERIES, paddingOuter=0.5))
    x = alt.X("ratio:Q", title="step time ÷ the same round's baseline step time (1.0 = baseline)",
              scale=alt.Scale(zero=False, padding=12))
    tip = [alt.Tooltip("setting:N"), alt.Tooltip("series:N", title="what"),
           alt.Tooltip("ratio:Q", title="ratio", format=".3f"), alt.Tooltip("lo:Q", title="interval low", format=".3f"),
           alt.Tooltip("hi:Q", title="interval high", format=".3f"), alt.Tooltip("verdict:N", title="verdict / basis")]
    intervals = df[(df["series"] == MEASURED) & df["lo"].notna()]
    layers = [
        alt.Chart(intervals).mark_rule(strokeWidth=3).encode(
            x=alt.X("lo:Q"), x2="hi:Q", y=y, yOffset=offset, color=_COLOUR, tooltip=tip),
        alt.Chart(df).mark_point(filled=True, size=110, opacity=1).encode(
            x=x, y=y, yOffset=offset, color=_COLOUR, shape=_SHAPE, tooltip=tip),
        alt.Chart(pd.DataFrame({"ratio": [1.0]})).mark_rule(strokeDash=[5, 4], color=RULE_COLOUR).encode(
            x="ratio:Q", tooltip=[alt.Tooltip("ratio:Q", title="baseline")]),
    ]
    t = title("Step time of each setting vs the baseline",
              "measured: each round's candidate ÷ that round's baseline; dashed line: the baseline (1.0); "
              "left of it is faster")
    rows = df["setting"].nunique() if not df.empty else 1
    return alt.layer(*layers).properties(title=t, width=WIDTH,
                                         height=CHROME_PX + LEGEND_PX + int(1.4 * ROW_PX) * max(2, rows))
