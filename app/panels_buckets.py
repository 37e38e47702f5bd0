"""The bucket timeline drawn for one step of one or more runs side by side: the Bucket timeline
page's and the Tune page's (a baseline trial beside a candidate's), one home for both; and Live's
typical-step bucket timeline with its caption (`live_bucket_timeline`, `detail_caption`).

Each run's chart comes from `app.charts.buckets.bucket_timeline` on `app.frames.buckets` frames;
side by side they share one time scale, so whose all-reduces end later is plain to see.
"""

from __future__ import annotations

import statistics

import pandas as pd
import streamlit as st

from ddpviz.app.charts.buckets import bucket_timeline
from ddpviz.app.frames import buckets as fb
from ddpviz.app.frames import detail
from ddpviz.app.frames import steps as fsteps
from ddpviz.app.widgets import pick_step, plain
from ddpviz.app.window import RunWindow
from ddpviz.engine.analysis import format_bytes, format_rate


def step_selector(windows, key: str) -> int | None:
    """Buttons for the kept steps (0, 1, a spread across the run, the newest); opens on a typical step of the first
    run (`fsteps.typical_step`: nearest the median step time, never the traced final step for
    being the newest) among those with measured spans, until the reader picks another; traced
    and sampled steps say so on their button."""
    steps = sorted(set().union(*(fb.bucket_steps(w.of_type("bucket")) for w in windows.values())))
    first = next(iter(windows.values()), None)
    typical = None
    if first is not None:
        typical = fsteps.typical_step(detail.bucket_candidates(first.of_type("bucket"), first.of_type("step")),
                                      first.of_type("step"))
    notes: dict[int, str] = {}
    for w in windows.values():
        notes.update(fsteps.step_notes(w.of_type("step"), w.of_type("bucket")))
    return pick_step(steps, key, default=typical, notes=notes)


def step_word(note: str | None) -> str:
    """What a step's caption adds for an instrumented or sampled step (`fsteps.step_notes`)."""
    if note == "instrumented":
        return " (instrumented: its time includes the instrument's own work)"
    return f" ({note})" if note else ""


def timeline(w, label: str, step: int, x_max: float | None) -> None:
    """One run's bucket timeline at `step` (x up to `x_max` ms when given) and its caption."""
    events = w.of_type("bucket")
    names = fb.rank_names(w.of_type("step") + events)
    buckets = fb.bucket_frame(events, step)
    if buckets.empty:
        st.info(f"{plain(label)}: no buckets recorded for step {step}.", icon=":material/info:")
        return
    backward = fb.backward_frame(w.of_type("step"), step)
    exposed = fb.exposed_frame(buckets, w.of_type("step"))
    st.altair_chart(bucket_timeline(fb.with_rank_names(buckets, names),
                                    fb.with_rank_names(backward, names),
                                    fb.with_rank_names(exposed, names),
                                    run=label, x_max_ms=x_max), key=f"bkt_tl_{w.run_id}")
    cfg = w.config
    r0 = buckets[buckets["rank"] == buckets["rank"].min()]
    note = fsteps.step_notes(w.of_type("step"), events).get(step)
    exposed_ms = exposed["exposed_ms"].max()
    st.caption(f"Step {step}{step_word(note)} · "
               f"{len(r0)} bucket(s) · bucket_cap_mb {fb.cap_text(cfg.get('bucket_cap_mb'))} · overlap "
               f"{'on' if cfg.get('overlap') else 'off'} · exposed comm "
               + (f"{exposed_ms:.2f} ms (slowest rank)" if pd.notna(exposed_ms) else "not measured on this step")
               + fb.synced_backwards_note(w.of_type("step"), step))



def side_by_side(windows, labels: dict[str, str], step: int) -> None:
    """`timeline` of every window at `step`, one column each, on one time scale when there are
    several (the latest all-reduce end, backward end or exposed band's end among them: with no all-reduce
    ends, bucket_timing=recorder, a band ran off the shared axis, a new user, 2026-12-06)."""
    x_max = max([e for w in windows.values() if pd.notna(e := fb.timeline_end_ms(w.of_type("bucket"),
                                                                               w.of_type("step"), step))],
                default=None) if len(windows) > 1 else None
    for col, (rid, w) in zip(st.columns(len(windows)), windows.items()):
        with col:
            timeline(w, labels[rid], step, x_max)


def live_bucket_timeline(w: RunWindow, buckets: pd.DataFrame):
    """The Bucket timeline page's chart (a lane per rank, a row per bucket) of the latest
    complete step; its title names no step, so the chart's spec — and the view, with a tooltip
    on screen — stays the same from one refresh to the next."""
    step = int(buckets["step"].iloc[0])
    names = fb.rank_names(w.of_type("step") + w.of_type("bucket"))
    backward = fb.backward_frame(w.of_type("step"), step)
    exposed = fb.exposed_frame(buckets, w.of_type("step"))
    return bucket_timeline(fb.with_rank_names(buckets, names),
                           fb.with_rank_names(backward, names),
                           fb.with_rank_names(exposed, names), run="Gradient buckets",
                           latest=True, lanes=list(names.values()))


def detail_caption(w: RunWindow, buckets: pd.DataFrame) -> None:
    """The caption under Live's bucket timeline of one run (`live_bucket_timeline`): the step, bytes, algbw."""
    r0 = buckets[buckets["rank"] == buckets["rank"].min()]
    bw = r0["algbw_gbps"].dropna()
    med = statistics.median(bw) if len(bw) else float("nan")
    said = detail.step_text(int(buckets["step"].iloc[0]), w.of_type("step"), w.of_type("bucket"))
    rate = (f"median all-reduce algbw {format_rate(med * 1e9)} (rank {int(r0['rank'].iloc[0])})" if len(bw)
            else "all-reduce algbw not measured on this step")
    # where an ordinary step has no all-reduce span, name the kept steps that have one (the tour, issue 33:
    # a first-time user never saw a measured all-reduce on the default run's typical step)
    timed = [s for s in fb.measured_steps(w.of_type("bucket")) if s != int(buckets["step"].iloc[0])]
    where = (f" All-reduce spans were measured on the sampled steps ({', '.join(map(str, timed[:6]))}"
             f"{'…' if len(timed) > 6 else ''}): open one on the Bucket timeline page, or launch with "
             "bucket_timing=hook to time every step." if not len(bw) and timed else "")
    grads, wire = int(r0["gradient_nbytes"].sum()), int(r0["nbytes"].sum())
    hook = w.config.get("comm_hook")
    hook = hook if hook and hook != "none" else "the comm hook"
    sent = f" ({format_bytes(wire)} all-reduced: the tensors {hook} handed over)" if wire != grads else ""
    again = fb.synced_backwards_note(w.of_type("step"), int(buckets["step"].iloc[0]))
    st.caption(f"{said}{again}: {len(r0)} bucket(s), {format_bytes(grads)} of gradients per rank{sent}; "
               f"{rate}. Every kept step, on the Bucket timeline page.{where}")
