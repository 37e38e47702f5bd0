"""What every chart shares: sizes, category colours, the step axis, title and legend helpers.

Streamlit draws Vega-Lite with autosize "fit": a chart's height is its whole box (title, axes,
legend), so heights here are the plot's rows plus room for those.
"""

from __future__ import annotations

import textwrap

import altair as alt
import pandas as pd

from ddpviz.app.frames import steps as fsteps

WIDTH = "container"
HEIGHT = 300
ROW_PX = 42  # one rank/device/run row in the timeline and bar charts
CHROME_PX = 120  # title, subtitle, x axis and its title
MAX_POINTS = 5000  # marks one chart may draw per refresh
STEP_X = alt.X("step:Q", title="optimizer step", axis=alt.Axis(tickMinStep=1, format="d"))
CATEGORIES = alt.Scale(scheme="tableau10")  # distinct hues for runs and devices
# one colour per kind of bytes (app.frames.steps.VOLUME_KINDS), the same on Live and Compare
VOLUME_COLOURS = dict(zip(fsteps.VOLUME_KINDS, ["#1f77b4", "#9467bd", "#d62728", "#ff9896", "#c7c7c7"]))
PHASE_COLOURS = ["#9467bd", "#8c564b", "#1f77b4", "#e377c2", "#7f7f7f", "#ff7f0e", "#d62728",
                 "#2ca02c"]  # in the order of frames.DP_PHASES
# The one home of each mode's colour (every chart that colours runs or modes reads it): the
# mode's own colour first, then shades of it for a second, third... run of the same mode.
MODE_HUES = {"single": ["#7f7f7f", "#3f3f3f", "#bdbdbd", "#5f5f5f"],
             "dp": ["#ff7f0e", "#a63603", "#fdae6b", "#d94801"],
             "ddp": ["#1f77b4", "#08306b", "#9ecae1", "#4292c6"],
             "fsdp": ["#2ca02c", "#00441b", "#a1d99b", "#41ab5d"]}
MODE_COLOURS = alt.Scale(domain=list(MODE_HUES), range=[h[0] for h in MODE_HUES.values()])
OTHER_RUN_COLOURS = ["#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf"]  # runs of no known mode


def run_colours(runs: list[str], modes: dict[str, str] | None = None) -> dict[str, str]:
    """run -> colour: each run in its mode's colour (`MODE_HUES`), a later run of the same mode in
    the next shade of it; a run whose mode is unknown takes the next of `OTHER_RUN_COLOURS`."""
    used: dict[str, int] = {}
    out = {}
    for run in runs:
        mode = (modes or {}).get(run)
        hues = MODE_HUES.get(mode, OTHER_RUN_COLOURS)
        key = mode if mode in MODE_HUES else "?"
        out[run] = hues[used.get(key, 0) % len(hues)]
        used[key] = used.get(key, 0) + 1
    return out


def run_scale(runs: list[str], modes: dict[str, str] | None = None) -> alt.Scale:
    """The colour scale of runs, in `runs` order (`run_colours`): one colour per mode, every page."""
    runs = list(dict.fromkeys(runs)) or [""]
    colours = run_colours(runs, modes)
    return alt.Scale(domain=runs, range=[colours[r] for r in runs])


def legend(title: str, orient: str = "right", **kw) -> alt.Legend:
    """A legend whose labels and title are never cut (`labelLimit`, `titleLimit` 0), however
    narrow the chart."""
    return alt.Legend(title=title, orient=orient, symbolOpacity=1, **{"labelLimit": 0, "titleLimit": 0, **kw})


# Vega cuts a title line at its chart's plot width with "…". The narrowest chart a page draws is
# half a page column (a ~320 px plot); at Vega's 13 px bold title (~7.4 px a character) and 11 px
# subtitle (~5.3, both measured in Chromium screenshots) these many characters fit it, so longer
# lines are wrapped.
TITLE_CHARS, SUBTITLE_CHARS = 41, 60


def wrap(text: str | list[str] | None, width: int) -> list[str]:
    """`text` (a string or lines) as lines of at most `width` characters, broken at spaces."""
    lines = text if isinstance(text, list) else [text or ""]
    return [part for line in lines for part in (textwrap.wrap(line, width, break_long_words=False) or [""])]


def title(text: str, subtitle: str | list[str] | None = None) -> alt.TitleParams:
    """A chart title anchored at the start, wrapped so no line is cut however narrow the chart
    (`TITLE_CHARS`, `SUBTITLE_CHARS`); a one-line title stays a string."""
    lines = wrap(text, TITLE_CHARS)
    return alt.TitleParams(text=lines[0] if len(lines) == 1 else lines,
                           subtitle=wrap(subtitle, SUBTITLE_CHARS) if subtitle else "", anchor="start")


def rows_height(df: pd.DataFrame, column: str, min_rows: int = 2, row_px: int = ROW_PX) -> int:
    """Box height (px) for a chart with one band per distinct `column` value."""
    rows = df[column].nunique() if not df.empty else 1
    return CHROME_PX + row_px * max(min_rows, rows)


def volume_scale(kinds) -> alt.Scale:
    """The colour scale of the kinds of bytes present in `kinds` (measured, derived, unlabelled,
    theory: `app.frames.steps.volume_label`), in `VOLUME_KINDS` order, so each one present has a
    legend entry and keeps its colour from chart to chart.

    Raises:
        ValueError: a kind no label names (a chart would draw it without a legend entry).
    """
    present = set(kinds)
    unknown = present - set(fsteps.VOLUME_KINDS)
    if unknown:
        raise ValueError(f"bytes kinds must be one of {fsteps.VOLUME_KINDS} (got {sorted(unknown)})")
    shown = [k for k in fsteps.VOLUME_KINDS if k in present] or fsteps.VOLUME_KINDS
    return alt.Scale(domain=shown, range=[VOLUME_COLOURS[k] for k in shown])
