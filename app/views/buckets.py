"""Bucket timeline: how DDP's gradient buckets all-reduce while backward still runs.

Per rank, for one step: the backward span, each bucket's ready time and all-reduce bar, and the
exposed communication (after the last bucket was ready) underlined. A step selector moves over
the kept steps (0, 1 and the latest few); step 0's layout and the one PyTorch rebuilt after it
are listed from the run's `bucket_preview`. Two runs (overlap on and off) sit side by
side on one time scale.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from ddpviz.app import runsets
from ddpviz.app.charts.buckets import bucket_timeline, exposed_chart
from ddpviz.app.connection import require_client
from ddpviz.app.frames import buckets as fb
from ddpviz.app.frames import steps as fsteps
from ddpviz.app.frames.compare import thin
from ddpviz.app.widgets import pick_step, quick_fields, show_errors
from ddpviz.engine.config import ConfigError
from ddpviz.workers.sweeps import submit_sweep

MAX_RUNS = 2


def launch_overlap_pair(client) -> None:
    """Two DDP runs of one config, overlap on and off (one group)."""
    with st.expander("Launch DDP with overlap on and off", icon=":material/rocket_launch:"):
        with st.form("buckets_launch"):
            values = quick_fields("bkt", overrides={"bucket_cap_mb": 0.1, "width": 256})
            go = st.form_submit_button("Launch overlap on / off", type="primary",
                                       key="buckets_launch_pair")
        if go:
            try:
                sweep = submit_sweep(client, values, "overlap", [True, False])
            except ConfigError as exc:
                show_errors(exc.errors)
                return
            st.session_state["focus_group"] = sweep
            st.session_state.pop("buckets_set", None)
            st.query_params.clear()
            st.rerun()


def ddp_runs(runs: list[dict]) -> list[dict]:
    ddp = [r for r in runs if runsets.mode(r) == "ddp"]
    if len(ddp) > MAX_RUNS:
        labels = runsets.unique_labels(ddp)
        keep = st.multiselect("DDP runs (one or two)", [r["run_id"] for r in ddp],
                              default=[r["run_id"] for r in ddp[:MAX_RUNS]],
                              max_selections=MAX_RUNS, format_func=labels.get, key="buckets_pick")
        ddp = [r for r in ddp if r["run_id"] in keep]
    return ddp


def step_selector(windows, key: str = "buckets_step") -> int | None:
    """Buttons for the kept steps (0, 1 and the latest few); opens on a typical step of the first
    run (`fsteps.typical_step`: nearest the median step time, never the traced final step for
    being the newest) among those with measured spans, until the reader picks another; traced
    and sampled steps say so on their button."""
    steps = sorted(set().union(*(fb.bucket_steps(w.of_type("bucket")) for w in windows.values())))
    first = next(iter(windows.values()), None)
    typical = None
    if first is not None:
        measured = fb.measured_steps(first.of_type("bucket")) or fb.bucket_steps(first.of_type("bucket"))
        typical = fsteps.typical_step(measured, first.of_type("step"))
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
               f"{len(r0)} bucket(s) · bucket_cap_mb {cfg.get('bucket_cap_mb')} · overlap "
               f"{'on' if cfg.get('overlap') else 'off'} · exposed comm "
               + (f"{exposed_ms:.2f} ms (slowest rank)" if pd.notna(exposed_ms) else "not measured on this step"))


def layouts(w, label: str) -> None:
    """Step 0's layout and the rebuilt one, from `bucket_preview`, vs what ran."""
    preview = (w.started or {}).get("bucket_preview") or {}
    measured = fb.measured_layouts(w.of_type("bucket"))
    st.markdown(f"**Bucket layout: {label}**")
    cfg = w.config
    first, second = fb.layout_captions(preview, bool(cfg.get("find_unused_parameters"))
                                       and not cfg.get("static_graph"))
    left, right = st.columns([2, 3])
    with left:
        st.caption(first)
        st.dataframe(fb.layout_frame(preview.get("initial")), hide_index=True,
                     key=f"bkt_init_{w.run_id}", column_config=_LAYOUT_COLUMNS)
    with right:
        st.caption(second)
        st.dataframe(fb.layout_frame(preview.get("rebuilt")), hide_index=True,
                     key=f"bkt_rebuilt_{w.run_id}", column_config=_LAYOUT_COLUMNS)
    seen = ", ".join(f"step {s}: {fb.buckets_text(len(b))}" for s, b in measured.items())
    if seen:
        st.caption(f"Measured in this run (rank 0, when the layout appeared or changed): {seen}. "
                   "The preview uses PyTorch's own assignment rule on this model.")


def distinct_layouts(windows) -> dict[str, object]:
    """One window per distinct `bucket_preview` (runs of one config share their layout)."""
    out: dict[str, object] = {}
    for rid, w in windows.items():
        key = repr((w.started or {}).get("bucket_preview"))
        out.setdefault(key, (rid, w))
    return dict(out.values())


_LAYOUT_COLUMNS = {"bucket": st.column_config.NumberColumn("bucket", width="small"),
                   "KiB": st.column_config.NumberColumn("KiB", format="%.1f", width="small"),
                   "tensors": st.column_config.NumberColumn("tensors", width="small"),
                   "parameters": st.column_config.TextColumn("parameters", width="large")}


def body(windows, labels) -> None:
    step = step_selector(windows)
    if step is None:
        st.info("Waiting for the first complete step of bucket events…",
                icon=":material/hourglass_empty:")
        return
    frames_at = [fb.bucket_frame(w.of_type("bucket"), step) for w in windows.values()]
    ends = [f["comm_end_ms"].max() for f in frames_at if not f.empty] + \
           [fb.backward_frame(w.of_type("step"), step)["end_ms"].max()
            for w in windows.values()]
    x_max = max([e for e in ends if pd.notna(e)], default=None) if len(windows) > 1 else None
    for col, (rid, w) in zip(st.columns(len(windows)), windows.items()):
        with col:
            timeline(w, labels[rid], step, x_max)
    per_step = pd.concat([thin(fb.exposed_per_step(w.of_type("step"), labels[rid]), 1000)
                          for rid, w in windows.items()], ignore_index=True)
    if not per_step.empty:
        st.altair_chart(exposed_chart(per_step, runsets.modes_of(windows, labels)), key="bkt_exposed")
    for rid, w in distinct_layouts(windows).items():
        layouts(w, labels[rid])


st.title("Bucket timeline")
st.caption("DDP reduces gradients in buckets: as soon as a bucket's gradients are ready its "
           "all-reduce starts, overlapping the rest of backward. What is left after the last "
           "bucket is ready is exposed communication.")
client = require_client()
launch_overlap_pair(client)
runs = runsets.pick_set(client, "buckets_set", runsets.has_modes("ddp"))
runs = ddp_runs(runs)
if not runs:
    runsets.no_runs("DDP runs")
    st.stop()
labels = runsets.unique_labels(runs)
windows = runsets.windows_for([r["run_id"] for r in runs])
runsets.live_body(client, windows, lambda: body(windows, labels), key="buckets")
