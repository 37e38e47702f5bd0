"""What every chart shares: sizes, category colours, the step axis, title and legend helpers.

Streamlit draws Vega-Lite with autosize "fit": a chart's height is its whole box (title, axes,
legend), so heights here are the plot's rows plus room for those.
"""

from __future__ import annotations

import textwrap

import altair as alt
import pandas as pd

from ddpviz.app.frames import steps as fsteps
from ddpviz.app.frames.dp import DP_PHASES

WIDTH = "container"
HEIGHT = 300
ROW_PX = 42  # one rank/device/run row in the timeline and bar charts
CHROME_PX = 120  # title, subtitle, x axis and its title
MAX_POINTS = 5000  # marks one chart may draw per refresh
STEP_X = alt.X("step:Q", title="optimizer step", axis=alt.Axis(tickMinStep=1, format="d"))
# a live chart's y-axis label gutter, px: fixed, so its plot area does not shift sideways when a refresh
# widens the labels ("800" -> "12,000"), which moved a panned x axis by ~5 px under load (issue 12's test)
LIVE_Y_AXIS = alt.Axis(minExtent=48)
CATEGORIES = alt.Scale(scheme="tableau10")  # kept for callers outside the charts; charts use the families below
# ---- one colour per meaning (issue 33) --------------------------------------------------------
# Every colour a chart draws is named here, once, and means one thing on every page: a hex never
# appears in two families below (tests/app/test_app_colours.py walks every page's charts). The
# families: a run's mode, a part or phase of a step, a device, the GIL, a kind of bytes, and the
# few pages' own series (theory, FSDP, sweeps, cluster).
# A mode: its own colour first, then shades of it for a second, third... run of the same mode.
MODE_HUES = {"single": ["#7f7f7f", "#3f3f3f", "#bdbdbd", "#5f5f5f"],
             "dp": ["#ff7f0e", "#a63603", "#fdae6b", "#d94801"],
             "ddp": ["#1f77b4", "#08306b", "#9ecae1", "#4292c6"],
             "fsdp": ["#2ca02c", "#00441b", "#a1d99b", "#41ab5d"]}
MODE_COLOURS = alt.Scale(domain=list(MODE_HUES), range=[h[0] for h in MODE_HUES.values()])
OTHER_RUN_COLOURS = ["#762a83", "#1b7837", "#b35806", "#2d004b", "#7f3b08"]  # runs of no known mode
# A part or phase of a step (Live's split, DP's phases, the bucket timeline, memory's background):
# compute in purples, host work in browns, DP's copies through device 0 in pinks, a bucket's
# all-reduce in dark red and communication nothing hid in light red, whatever its page.
PHASE_HUES = {"forward": "#6a3d9a", "backward": "#c2a5cf", "loss": "#dfc27d", "optimizer": "#8c510a",
              "broadcast": "#f1b6da", "scatter": "#fa9fb5", "gather": "#de77ae", "reduce": "#c51b7d",
              fsteps.DP_COPIES_PART: "#8e0152", "all-reduce": "#b2182b", "exposed comm": "#fc9272",
              "bucket ready": "#000000", "other": "#d9d9d9", "idle": "#f7f7f7",
              "instrument": "#ffffb3"}
GIL_COLOUR = "#01665e"  # time a thread waited for the GIL (measured: schedstat), every chart
# A device (cpu:0, cuda:1, rank 2...), by its index: lines of memory per device.
DEVICE_HUES = ["#1b9e77", "#e6ab02", "#66a61e", "#7570b3", "#e7298a", "#a6761d", "#666666", "#17becf"]
SHARED_DEVICE_COLOUR = "#4d4d4d"  # what no one device holds: DP's one process, all its devices together
# one colour per kind of bytes (app.frames.steps.VOLUME_KINDS), the same on Live and Compare
VOLUME_COLOURS = dict(zip(fsteps.VOLUME_KINDS, ["#35978f", "#80cdc1", "#c7eae5", "#bababa", "#878787"]))
PHASE_COLOURS = [PHASE_HUES[p] for p in DP_PHASES]  # in the order of frames.dp.DP_PHASES
# The pages' own series, each a family of its own.
THEORY_HUES = {"probe": "#252525", "probe algbw": "#969696", "alone": "#4d9221", "overlapped": "#bf812d",
               "fit probe": "#d73027", "fit buckets": "#4575b4"}
FSDP_HUES = {"forward pass": "#efedf5", "backward pass": "#dadaeb", "all-gather (forward)": "#005a32",
             "all-gather (backward)": "#74c476", "reduce-scatter": "#99000d",
             "sharded_params": "#08519c", "unsharded_params": "#6baed6", "sharded_grads": "#a50f15",
             "unsharded_grads": "#ef3b2c", "optimizer_state": "#54278f", "comm_buffers": "#fd8d3c",
             "activations": "#006d2c", "buffers": "#737373",
             "own shard": "#2171b5", "received in all-gather": "#c7e9c0", "sent for reduce-scatter": "#fcbba1",
             "kept: reduced shard": "#cb181d", "not held": "#f0f0f0"}
SWEEP_HUES = {"step time": "#4a1486", "exposed comm": PHASE_HUES["exposed comm"]}
MEMORY_USE_HUES = {"used": "#238b45", "total": "#e5e5e5"}  # the Cluster page's GPU memory bars
TUNE_HUES = {"measured": "#252a5e", "predicted": "#b07aa1"}  # the Tune page: a trial measured vs predicted
THREAD_STATE_HUES = {"running (on a CPU)": "#9e9ac8", "waiting for the GIL": GIL_COLOUR,
                     "waiting for a CPU (all cores busy)": "#cccccc", "outside its timed work": "#fff7bc",
                     "waiting for the all-reduce": PHASE_HUES["exposed comm"]}


def device_scale(devices) -> alt.Scale:
    """The colour scale of devices: each device by its index (the number after its last ':' or
    space: "cpu:1", "cuda:1", "rank 1" share `DEVICE_HUES[1]`), so a device keeps its colour on
    every chart; a name without a number (DP's one process, all its devices) `SHARED_DEVICE_COLOUR`."""
    names = list(dict.fromkeys(devices)) or [""]

    def hue(name: str) -> str:
        tail = str(name).replace(":", " ").split()[-1:] or [""]
        return DEVICE_HUES[int(tail[0]) % len(DEVICE_HUES)] if tail[0].isdigit() else SHARED_DEVICE_COLOUR
    return alt.Scale(domain=names, range=[hue(n) for n in names])


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


def drawn_scale(hues: dict[str, str], values) -> alt.Scale:
    """The colour scale of those categories of `hues` (name -> colour, a family above) that are
    among `values`, in `hues` order: a legend lists only what its chart draws, each category in
    its one colour. None drawn: the whole family (an empty chart's legend still says what it
    would draw)."""
    present = set(values)
    shown = [k for k in hues if k in present] or list(hues)
    return alt.Scale(domain=shown, range=[hues[k] for k in shown])


def legend(title: str, orient: str = "right", **kw) -> alt.Legend:
    """A legend whose labels and title are never cut (`labelLimit`, `titleLimit` 0), however
    narrow the chart."""
    return alt.Legend(title=title, orient=orient, symbolOpacity=1, **{"labelLimit": 0, "titleLimit": 0, **kw})


def stacked_legends(chart, *orients: str):
    """`chart` (a top-level chart) with its legends on each of `orients` ("top", "bottom") one
    under the other. Vega lays the legends that share a side in one row, as wide as they are
    together, and never wraps it: in a half- or third-column chart the row ran past the canvas and
    its last labels were cut ("hub (dev", seen in Chromium), whatever their `labelLimit`."""
    sides = ", ".join(f"{o}: {{direction: 'vertical', anchor: 'start'}}" for o in orients)
    return chart.configure_legend(layout=alt.ExprRef(expr=f"{{{sides}}}"))


# Vega cuts a title line at its chart's plot width with "…". The narrowest chart a page draws is
# half a page column (a ~320 px plot); at Vega's 13 px bold title (~7.4 px a character) and 11 px
# subtitle (~5.3, both measured in Chromium screenshots) these many characters fit it, so longer
# lines are wrapped.
TITLE_CHARS, SUBTITLE_CHARS = 41, 60


def wrap(text: str | list[str] | None, width: int) -> list[str]:
    """`text` (a string or lines) as lines of at most `width` characters, broken at spaces."""
    lines = text if isinstance(text, list) else [text or ""]
    return [part for line in lines for part in (textwrap.wrap(line, width, break_long_words=False) or [""])]


def title(text: str, subtitle: str | list[str] | None = None,
          chars: tuple[int, int] = (TITLE_CHARS, SUBTITLE_CHARS)) -> alt.TitleParams:
    """A chart title anchored at the start, wrapped so no line is cut however narrow the chart:
    at most `chars` (title, subtitle) characters a line, by default `TITLE_CHARS` and
    `SUBTITLE_CHARS` (a narrower chart passes its own); a one-line title stays a string."""
    lines = wrap(text, chars[0])
    return alt.TitleParams(text=lines[0] if len(lines) == 1 else lines,
                           subtitle=wrap(subtitle, chars[1]) if subtitle else "", anchor="start")


def rows_height(df: pd.DataFrame, column: str, min_rows: int = 2, row_px: int = ROW_PX,
                title_params: alt.TitleParams | None = None) -> int:
    """Box height (px) for a chart with one band per distinct `column` value; with `title_params`,
    room for each title and subtitle line past the first two (`TITLE_LINE_PX`), so a long
    subtitle never pushes the title out of the box (Streamlit's autosize "fit")."""
    rows = df[column].nunique() if not df.empty else 1
    return CHROME_PX + row_px * max(min_rows, rows) + extra_title_px(title_params)


TITLE_LINE_PX = 16  # one more title or subtitle line


def extra_title_px(t: alt.TitleParams | None) -> int:
    """Pixels for each title and subtitle line past the first two (`TITLE_LINE_PX`)."""
    if t is None:
        return 0
    text, sub = t.to_dict().get("text", ""), t.to_dict().get("subtitle", "")
    lines = (len(text) if isinstance(text, list) else 1) + (len(sub) if isinstance(sub, list) else int(bool(sub)))
    return TITLE_LINE_PX * max(0, lines - 2)


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
