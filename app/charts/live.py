"""The Live page's step-axis charts: throughput over the whole run and validation accuracy, with a
step axis people can zoom and pan, kept across live refreshes.

How the state survives (Streamlit 1.67, `ArrowVegaLiteChart`): a chart drawn again under the same
key with the same spec keeps its Vega view, and only its datasets are swapped — so a tooltip on
screen stays. Everything that changes while a run trains is therefore data, never the spec (no
counts or step numbers in titles). Streamlit does clear a scale-bound selection (the zoom) when
the data changes, unless that selection is one the app listens to: the panels draw these charts
with ``on_select`` and ``selection_mode=SELECTIONS``, so the zoom (`ZOOM`) and the run picked in
the legend (`PICK`) are widget state, kept across refreshes and restored if a view is rebuilt.

Pure: `DataFrame -> alt.Chart`.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from ddpviz.app.charts.style import HEIGHT, LIVE_Y_AXIS, run_scale, title
from ddpviz.app.frames.steps import SMOOTH_STEPS

ZOOM = "zoom_step"  # drag to pan, shift + wheel to zoom the step axis; double-click to reset
# the wheel alone scrolls the page: a plain wheel over the chart zoomed it (a reader scrolling Live
# past it collapsed every step into one tick, seen in a fresh-user review); Vega-Lite's event filter
ZOOM_WITH = "wheel![event.shiftKey]"
PICK = "pick_run"  # click a run in the legend to bring it forward
SELECTIONS = [ZOOM, PICK]  # what the throughput chart's panel listens to; accuracy: [ZOOM]
WIDTH = "container"


def _colour(runs: list[str], modes: dict[str, str] | None) -> alt.Color:
    scale = run_scale(runs, modes)
    # labelLimit 0: run names are never cut, however narrow the column
    return alt.Color("run:N", scale=scale, legend=alt.Legend(title="run", orient="top", labelLimit=0,
                                                             symbolOpacity=1, columns=2))


def step_zoom() -> alt.Parameter:
    """The step axis's pan and zoom (`ZOOM`): drag pans, shift + wheel zooms (`ZOOM_WITH`)."""
    return alt.selection_interval(bind="scales", encodings=["x"], name=ZOOM, zoom=ZOOM_WITH)


def _params():
    zoom = step_zoom()
    pick = alt.selection_point(fields=["run"], bind="legend", name=PICK)
    return zoom, pick, alt.condition(pick, alt.value(1.0), alt.value(0.15))


def live_throughput_chart(recent: pd.DataFrame, earlier: pd.DataFrame, runs: list[str],
                          window_steps: int, modes: dict[str, str] | None = None) -> alt.LayerChart:
    """Samples/s per step over the whole run: the newest `window_steps` steps one by one (a dot
    per step, its time the mean over ranks; a line through the rolling median), the steps before them in
    bins (dashed: each bin's mean; band: its min–max).

    Args:
        recent: `app.frames.steps.steps_frame` rows of every run (its window).
        earlier: `app.step_history.StepHistory.frame` rows of every run; an optional `segment`
            column splits a run's dashed line where steps between bins were never read.
        runs: the runs in legend order (fixes each run's colour).
        window_steps: steps a run's window keeps (`RunWindow.max_steps`), for the subtitle.
        modes: run -> mode, for each run's colour (`app.charts.style.run_scale`).
    """
    zoom, pick, faded = _params()
    colour = _colour(runs, modes)
    x = alt.X("step:Q", title="optimizer step", axis=alt.Axis(tickMinStep=1, format="d"))
    y_title = "throughput (samples/s)"
    tip_step = [alt.Tooltip("run:N"), alt.Tooltip("step:Q"),
                alt.Tooltip("samples_per_s:Q", title="samples/s", format=",.0f"),
                alt.Tooltip("samples_per_s_smooth:Q", title=f"rolling median ({SMOOTH_STEPS} steps)",
                            format=",.0f"),
                alt.Tooltip("step_time_ms:Q", title="step time (ms)", format=".2f")]
    tip_bin = [alt.Tooltip("run:N"), alt.Tooltip("step_lo:Q", title="from step"),
               alt.Tooltip("step_hi:Q", title="to step"), alt.Tooltip("steps:Q", title="steps in bin"),
               alt.Tooltip("mean:Q", title="mean samples/s", format=",.0f"),
               alt.Tooltip("lo:Q", title="min", format=",.0f"), alt.Tooltip("hi:Q", title="max", format=",.0f")]
    dots = alt.Chart(recent).mark_circle(size=16, opacity=0.4).encode(
        x=x, y=alt.Y("samples_per_s:Q", title=y_title, axis=LIVE_Y_AXIS), color=colour, tooltip=tip_step,
    ).add_params(zoom, pick)
    line = alt.Chart(recent).mark_line(strokeWidth=2).encode(
        x=x, y="samples_per_s_smooth:Q", color=colour, opacity=faded, tooltip=tip_step)
    # Before step 500 the bins' layers have no rows, and Vega warns "Infinite extent" in the browser's
    # console for their fields. Kept so: the spec stays the run's for its whole life (a layer added at the
    # first bin would re-create the view), and one bin of no size in their place made a tooltip held on
    # the step-time split vanish at refreshes (tests/app/test_app_browser_live.py red 3 of 8, 2026-12-05)
    band = alt.Chart(earlier).mark_rect(opacity=0.18).encode(
        x="step_lo:Q", x2="step_hi:Q", y="lo:Q", y2="hi:Q", color=colour, tooltip=tip_bin)
    if "segment" not in earlier:  # no unread steps: one line per run
        earlier = earlier.assign(segment=0)
    mean = alt.Chart(earlier).mark_line(strokeDash=[5, 3], strokeWidth=1.5).encode(
        x="step_mid:Q", y="mean:Q", color=colour, opacity=faded, tooltip=tip_bin,
        detail="segment:N")  # never drawn across steps that were not read
    return alt.layer(dots, line, band, mean).properties(
        width=WIDTH, height=HEIGHT + 90,
        title=title("Throughput per step", subtitle=[
            f"the newest steps (up to {window_steps}): a dot per step (mean over ranks), line = rolling median "
            f"of {SMOOTH_STEPS} steps",
            "steps before those: dashed = mean per bin, band = min–max · "
            "drag to pan, shift + wheel to zoom, double-click to reset"]))


def accuracy_chart(accuracy: pd.DataFrame, runs: list[str], modes: dict[str, str] | None = None) -> alt.Chart:
    """Validation accuracy at each evaluation (`app.frames.steps.eval_frame` rows of every run), 0–1.
    Drawn under the throughput chart, in its colours, so it needs no legend of its own."""
    zoom = step_zoom()
    colour = alt.Color("run:N", legend=None, scale=run_scale(runs, modes))
    return alt.Chart(accuracy).mark_line(point=alt.OverlayMarkDef(size=30)).encode(
        x=alt.X("step:Q", title="optimizer step", axis=alt.Axis(tickMinStep=1, format="d")),
        y=alt.Y("val_accuracy:Q", title="validation accuracy", scale=alt.Scale(domain=[0, 1])),
        color=colour,
        tooltip=[alt.Tooltip("run:N"), alt.Tooltip("step:Q"),
                 alt.Tooltip("val_accuracy:Q", title="accuracy", format=".3f"),
                 alt.Tooltip("val_loss:Q", title="validation loss", format=".4f")],
    ).add_params(zoom).properties(
        width=WIDTH, height=HEIGHT - 40,  # room for a two-line subtitle in a half column
        title=title("Validation accuracy", "share of the held-out split classified right, at every "
                                           "evaluation (eval_every steps and the end); colours as above"))


def loss_chart(steps: pd.DataFrame, runs: list[str], modes: dict[str, str] | None = None) -> alt.Chart:
    """Training loss per step (`app.frames.steps.steps_frame` rows with a `loss`), as the run's
    script reported it: an attached run's stand-in for the accuracy chart, in the same place and
    colours (no legend of its own)."""
    zoom = step_zoom()
    colour = alt.Color("run:N", legend=None, scale=run_scale(runs, modes))
    return alt.Chart(steps.dropna(subset=["loss"])).mark_line(strokeWidth=1.5).encode(
        x=alt.X("step:Q", title="optimizer step", axis=alt.Axis(tickMinStep=1, format="d")),
        y=alt.Y("loss:Q", title="training loss"),  # short: a long title overflows the plot's height
        color=colour,
        tooltip=[alt.Tooltip("run:N"), alt.Tooltip("step:Q"), alt.Tooltip("loss:Q", title="loss", format=".4g")],
    ).add_params(zoom).properties(
        width=WIDTH, height=HEIGHT - 40,
        title=title("Training loss",
                    "the script's own loss each step (mean over ranks); no validation; colours as above"))
