"""Chart builders of the Buckets page (pure: `DataFrame -> alt.Chart`).

The timeline has one lane per rank (``rank r @ host`` on multi-host runs) and a sub-row per
bucket in it: the backward span behind, each bucket's all-reduce bar, a tick when the bucket
became ready, and the exposed communication (after the last bucket was ready) as a light red band under
the lane, where no bar covers it (`app.charts.style.PHASE_HUES`: light red is exposed communication on every page).
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from ddpviz.app.charts.style import (CHROME_PX, HEIGHT, PHASE_HUES, ROW_PX, STEP_X, WIDTH, extra_title_px, legend,
                                     run_scale, title)

KINDS = ["backward (compute)", "all-reduce (a bar per bucket)", "bucket ready",
         "exposed comm",  # exposed: after the last bucket was ready
         "all-reduce began (end not measured)"]  # a step whose events carry the start only
# drawn opaque: the legend's swatch is the mark's colour (`app.charts.style.PHASE_HUES`: one per meaning)
COLOURS = [PHASE_HUES["backward"], PHASE_HUES["all-reduce"], PHASE_HUES["bucket ready"], PHASE_HUES["exposed comm"],
           PHASE_HUES["all-reduce"]]
COLOUR_NAMES = dict(zip(KINDS, ["light purple", "dark red", "black", "light red", "dark red"]))  # for the notes
EXPOSED_NOTE = f"{COLOUR_NAMES[KINDS[3]]} under a lane: {KINDS[3]}"  # the subtitle's words for the exposed band


def _kind_colour(bars: bool, starts: bool) -> alt.Color:
    """The legend of a step's marks: backward, bucket ready and exposed comm always (every step has
    them, so Live's spec stays the same from step to step); the all-reduce's bar only where a bucket's
    all-reduce end was measured, its start mark only where the start alone was (a recorder step
    listed "all-reduce (a bar per bucket)" and drew none: the tour, issue 33)."""
    shown = [k for i, k in enumerate(KINDS) if i in (0, 2, 3) or (i == 1 and bars) or (i == 4 and starts)]
    return alt.Color("kind:N", legend=legend("", orient="bottom", columns=2),
                     scale=alt.Scale(domain=shown, range=[COLOURS[KINDS.index(k)] for k in shown]))
SUB_ROW_PX = 20  # one bucket's row inside a rank's lane
MAX_LANE_PX = 260  # many buckets share this much height per rank
LEGEND_PX = 70  # the legend below the plot, two rows


def _rows(buckets: pd.DataFrame, backward: pd.DataFrame, exposed: pd.DataFrame, lanes: list[str]
          ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, int]:
    """Numeric rows: rank lane i spans [i·(B+1), i·(B+1)+B] and the bucket of `row` j sits in row j of it; the
    exposed band sits in the gap under the lane (`EXPOSED_BAND`), where no all-reduce bar can cover it (drawn
    across the lane it was hidden under the bars it follows: 0.2 ms of light red showed for 5.13 ms exposed, a new
    user, 2026-12-06)."""
    n = max(1, int(buckets["row"].max()) + 1) if not buckets.empty else 1
    base = {lane: i * (n + 1) for i, lane in enumerate(lanes)}

    def lane_span(df: pd.DataFrame) -> pd.DataFrame:
        y0 = df["lane"].map(base).astype(float)
        return df.assign(y0=y0, y1=y0 + n)

    y0 = exposed["lane"].map(base).astype(float) + n + EXPOSED_BAND[0]
    under = exposed.assign(y0=y0, y1=y0 + EXPOSED_BAND[1] - EXPOSED_BAND[0])
    b = buckets.assign(y0=buckets["lane"].map(base) + buckets["row"] + 0.15)
    b["y1"] = b["y0"] + 0.7
    return lane_span(backward), under, b, n


EXPOSED_BAND = (-0.1, 0.4)  # the exposed band's rows, from the lane's end: the last bucket row's margin and the gap


def bucket_timeline(buckets: pd.DataFrame, backward: pd.DataFrame, exposed: pd.DataFrame, *,
                    run: str, x_max_ms: float | None = None, latest: bool = False,
                    lanes: list[str] | None = None) -> alt.LayerChart:
    """One DDP step of one run: a lane per rank, a row per bucket inside it.

    Args:
        buckets: `app.frames.buckets.bucket_frame` + `lane` (`app.frames.buckets.with_rank_names`).
        backward: `app.frames.buckets.backward_frame` + `lane`.
        exposed: `app.frames.buckets.exposed_frame` + `lane`.
        run: the run's label, for the title.
        x_max_ms: shared x extent when two runs are drawn side by side.
        latest: the Live page's view of the latest step: the title names neither the step nor
            the bucket count, so the spec stays the same while the run trains.
        lanes: every rank's lane, in order (default: the ranks in these frames). Live passes all
            the run's ranks, so a step whose events are still arriving draws the same lanes.
    """
    step = int(buckets["step"].iloc[0]) if not buckets.empty else None
    if lanes is None:
        lanes = list(dict.fromkeys(list(backward.get("lane", [])) + list(buckets.get("lane", []))))
    bwd, exp, rows, n = _rows(buckets, backward, exposed, lanes)
    centers = [i * (n + 1) + n / 2 for i in range(len(lanes))]
    names = " : ".join(f"datum.value == {c} ? '{lane}'" for c, lane in zip(centers, lanes))
    y_scale = alt.Scale(domain=[-0.5, len(lanes) * (n + 1) - 0.5], reverse=True, nice=False, zero=False)
    y = alt.Y("y0:Q", title="rank", scale=y_scale,
        axis=alt.Axis(values=centers, labelExpr=f"{names} : ''" if names else "''",
                      grid=False, ticks=False))
    scale = alt.Scale(domain=[0, x_max_ms], nice=False) if x_max_ms else alt.Scale()
    # each lane from its own rank's backward start: the ranks' backwards need not begin together (a new user read
    # rank 1 finishing an all-reduce rank 0 had not joined, 2026-12-06), and hosts' clocks differ across nodes
    x = alt.X("start_ms:Q", title="ms from each rank's own backward start", scale=scale)
    starts = rows[rows["comm_start_ms"].notna() & rows["comm_end_ms"].isna()] if not rows.empty else rows
    kind = _kind_colour(bool(not rows.empty and rows["comm_end_ms"].notna().any()), not starts.empty)
    layers = [
        alt.Chart(bwd.assign(kind=KINDS[0])).mark_rect().encode(
            x=x, x2="end_ms:Q", y=y, y2="y1:Q", color=kind,
            tooltip=[alt.Tooltip("lane:N", title="rank"),
                     alt.Tooltip("end_ms:Q", title="backward (ms)", format=".2f")]),
        alt.Chart(exp.assign(kind=KINDS[3])).mark_rect().encode(
            x=x, x2="end_ms:Q", y=y, y2="y1:Q", color=kind,
            tooltip=[alt.Tooltip("lane:N", title="rank"),
                     alt.Tooltip("exposed_ms:Q", title="exposed (ms)", format=".2f"),
                     alt.Tooltip("reported_ms:Q", title="engine's comm_exposed (ms)",
                                 format=".2f")])]
    tip = [alt.Tooltip("lane:N", title="rank"), alt.Tooltip("bucket:N", title="bucket"),
           alt.Tooltip("nbytes:Q", title="bytes", format=","),
           alt.Tooltip("num_params:Q", title="tensors"),
           alt.Tooltip("ready_ms:Q", title="ready (ms)", format=".2f"),
           alt.Tooltip("comm_start_ms:Q", title="all-reduce start (ms)", format=".2f"),
           alt.Tooltip("comm_end_ms:Q", title="all-reduce end (ms)", format=".2f"),
           alt.Tooltip("algbw_gbps:Q", title="algbw (GB/s)", format=".3f"),
           *([alt.Tooltip("enqueue_ms:Q", title="host launch (ms, host clock)", format=".2f")]
             if "enqueue_ms" in rows else []),
           *([alt.Tooltip("source:N", title="measured by")] if "source" in rows else [])]
    layers.append(alt.Chart(rows.assign(kind=KINDS[1])).mark_rect().encode(
        x=alt.X("comm_start_ms:Q", scale=scale), x2="comm_end_ms:Q", y=y, y2="y1:Q",
        color=kind, tooltip=tip))
    layers.append(alt.Chart(rows.assign(kind=KINDS[2])).mark_rule(strokeWidth=2.5).encode(
        x=alt.X("ready_ms:Q", scale=scale), y=y, y2="y1:Q", color=kind, tooltip=tip))
    if not starts.empty:  # the start is measured, the end is not: a mark at the start, never a bar
        layers.append(alt.Chart(starts.assign(kind=KINDS[4], y_mid=starts["y0"] + 0.35)).mark_point(
            shape="triangle-right", filled=True, size=70, opacity=1).encode(
            x=alt.X("comm_start_ms:Q", scale=scale), y=alt.Y("y_mid:Q", scale=y_scale), color=kind,
            tooltip=tip))
    ddps = int(buckets["ddp_index"].nunique()) if not buckets.empty and "ddp_index" in buckets else 1
    if ddps > 1:  # several DDPs in one process (an attached GAN): "DDP k" at the first of its rows
        first = rows.groupby(["lane", "ddp_index"], as_index=False)["y0"].min()
        marks = first.assign(y0=first["y0"] + 0.35, start_ms=0.0,
                             text=[f"DDP {int(k)}" for k in first["ddp_index"]])
        layers.append(alt.Chart(marks).mark_text(align="left", baseline="middle", dx=3, fontSize=10,
                                                 color="#333333").encode(
            x=alt.X("start_ms:Q", scale=scale), y=y, text="text:N"))
    lane_px = min(MAX_LANE_PX, max(ROW_PX, SUB_ROW_PX * (n + 1)))
    label = f"{run}: step {step}" if step is not None and not latest else run
    whose = f" of {ddps} DDPs (DDP 0's rows first)" if ddps > 1 else ""
    sub = (f"{n} bucket(s){whose} per rank, a row each; {EXPOSED_NOTE}" if not latest else
           f"a typical step: a lane per rank, a row per bucket{whose}; {EXPOSED_NOTE}")
    if not buckets.empty and buckets["comm_end_ms"].isna().all():
        sub += f"; {unmeasured_words(buckets)} not measured on this step"
        sources = sorted({str(x).split(":")[0] for x in buckets.get("source", [])} - {"", "nan", "None"})
        drawn = buckets["ready_ms"].notna().any() or buckets["comm_start_ms"].notna().any()
        how = "hover a bucket for how" if drawn else "nothing of theirs to draw on this axis" + (
            ": their host launch times are on the host's clock, not the GPU's"
            if "enqueue_ms" in buckets and buckets["enqueue_ms"].notna().any() else "")
        sub += f" (measured by {', '.join(sources)}; {how})" if sources else ""
    head = title(label, sub)
    return alt.layer(*layers).properties(
        title=head, width=WIDTH,
        height=CHROME_PX + LEGEND_PX + lane_px * max(2, len(lanes)) + extra_title_px(head))


def unmeasured_words(buckets: pd.DataFrame) -> str:
    """What a step without all-reduce ends lacks: "all-reduce start and end" where ready times were
    measured (bucket_timing=recorder on gloo: DDP's reducer), "all-reduce ends" where starts were
    (an event with a start and no end), else "bucket times" (e.g. a CUDA no-hook step: host launch
    times only, `enqueue_ms`, which are not on the GPU's timeline)."""
    if buckets["comm_start_ms"].notna().any():
        return "all-reduce ends"
    return "all-reduce start and end" if buckets["ready_ms"].notna().any() else "bucket times"


SPIKE_FACTOR = 3.0  # a step this many times the 95th percentile runs off the axis (`exposed_axis_cap`)


def exposed_axis_cap(values: pd.Series) -> float | None:
    """The exposed-comm axis's top (ms) when a few steps would flatten the rest: 1.5 × the 95th
    percentile, once the slowest step is above `SPIKE_FACTOR` × it (the tour, issue 33: rare 50-100 ms
    waits set a 0-100 ms axis over ~2 ms typical steps); None otherwise (the axis fits every step)."""
    v = pd.to_numeric(values, errors="coerce").dropna()
    if len(v) < 20:
        return None
    p95 = float(v.quantile(0.95))
    return 1.5 * p95 if p95 > 0 and float(v.max()) > SPIKE_FACTOR * p95 else None


def exposed_chart(per_step: pd.DataFrame, modes: dict[str, str] | None = None) -> alt.Chart:
    """Exposed communication per step, one line per run (`app.frames.buckets.exposed_per_step`),
    each in its mode's colour (`modes`: run -> mode). When a few steps would flatten the rest
    (`exposed_axis_cap`), the axis stops above the 95th percentile and those steps are drawn as
    triangles at its top, their values in the tooltip and their count in the subtitle: none hidden."""
    cap = exposed_axis_cap(per_step["exposed_ms"]) if not per_step.empty else None
    colour = alt.Color("run:N", legend=legend("run"), scale=run_scale(list(per_step["run"]), modes))
    tip = [alt.Tooltip("run:N"), alt.Tooltip("step:Q"), alt.Tooltip("exposed_ms:Q", title="exposed (ms)", format=".2f")]
    sub = "slowest rank's all-reduce time that backward could not hide; lower is better"
    y = alt.Y("exposed_ms:Q", title="exposed comm (ms)")
    layers = []
    if cap is not None:
        over = per_step[per_step["exposed_ms"] > cap]
        y = alt.Y("exposed_ms:Q", title="exposed comm (ms)", scale=alt.Scale(domain=[0, cap], clamp=True))
        sub += (f"; the axis stops at {cap:.2f} ms: {len(over)} step(s) above it (up to "
                f"{over['exposed_ms'].max():.1f} ms) are the triangles at its top")
        layers.append(alt.Chart(over.assign(top=cap)).mark_point(shape="triangle-up", filled=True, size=60).encode(
            x=STEP_X, y=alt.Y("top:Q", scale=alt.Scale(domain=[0, cap])), color=colour, tooltip=tip))
    line = alt.Chart(per_step).mark_line(point=alt.OverlayMarkDef(size=16), clip=True).encode(
        x=STEP_X, y=y, color=colour, tooltip=tip)
    return alt.layer(line, *layers).properties(title=title("Exposed communication per step", sub),
                                               width=WIDTH, height=HEIGHT - 40)
