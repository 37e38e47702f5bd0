"""The bucket timeline drawn for one step of one or more runs side by side: the Bucket timeline
page's and the Tune page's (a baseline trial beside a candidate's), one home for both.

Each run's chart comes from `app.charts.buckets.bucket_timeline` on `app.frames.buckets` frames;
side by side they share one time scale, so whose all-reduces end later is plain to see.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from ddpviz.app.charts.buckets import bucket_timeline
from ddpviz.app.frames import buckets as fb
from ddpviz.app.frames import detail
from ddpviz.app.frames import steps as fsteps
from ddpviz.app.widgets import pick_step


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
        st.info(f"{label}: no buckets recorded for step {step}.", icon=":material/info:")
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
    several (the latest all-reduce end or backward end among them)."""
    frames_at = [fb.bucket_frame(w.of_type("bucket"), step) for w in windows.values()]
    ends = [f["comm_end_ms"].max() for f in frames_at if not f.empty] + \
           [fb.backward_frame(w.of_type("step"), step)["end_ms"].max()
            for w in windows.values()]
    x_max = max([e for e in ends if pd.notna(e)], default=None) if len(windows) > 1 else None
    for col, (rid, w) in zip(st.columns(len(windows)), windows.items()):
        with col:
            timeline(w, labels[rid], step, x_max)
