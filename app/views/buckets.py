"""Bucket timeline: how DDP's gradient buckets all-reduce while backward still runs.

Per rank, for one step: the backward span, each bucket's ready time and all-reduce bar, and the
exposed communication (after the last bucket was ready) underlined. A step selector moves over
the kept steps (0, 1, one every few across the run, the newest); step 0's layout and the one PyTorch rebuilt after it
are listed from the run's `bucket_preview`. Two runs (overlap on and off) sit side by
side on one time scale.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from ddpviz.app import runsets
from ddpviz.app.charts.buckets import exposed_chart
from ddpviz.app.connection import require_client
from ddpviz.app.frames import buckets as fb
from ddpviz.app.frames.compare import thin
from ddpviz.app.panels_buckets import side_by_side, step_selector
from ddpviz.app.widgets import plain, quick_fields, show_errors
from ddpviz.engine.config import ConfigError
from ddpviz.workers.sweeps import submit_sweep

MAX_RUNS = 2


def launch_overlap_pair(client) -> None:
    """Two DDP runs of one config, overlap on and off (one group)."""
    with st.expander("Launch DDP with overlap on and off", icon=":material/rocket_launch:"):
        with st.form("buckets_launch"):
            # both sides timed by the comm hook on every step: the same instrument on each, and
            # overlap % measured (the default recorder times all-reduces on profiled steps only)
            values = quick_fields("bkt", overrides={"bucket_cap_mb": 0.1, "width": 256, "bucket_timing": "hook"})
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


def layouts(w, label: str) -> None:
    """Step 0's layout and the rebuilt one, from `bucket_preview`, vs what ran."""
    preview = (w.started or {}).get("bucket_preview") or {}
    measured = fb.measured_layouts(w.of_type("bucket"))
    st.markdown(f"**Bucket layout: {plain(label)}**")
    st.caption("Both tables are the preview: PyTorch's own assignment rule run on this model before training "
               "(the run's `bucket_preview`); the line under them is what the run measured.")
    cfg = w.config
    first, second = fb.layout_captions(preview, bool(cfg.get("find_unused_parameters"))
                                       and not cfg.get("static_graph"))
    left, right = st.columns(2)  # equal: each table's parameter cell holds "first … last"
    with left:
        st.caption(first)
        st.dataframe(fb.layout_frame(preview.get("initial")), hide_index=True,
                     key=f"bkt_init_{w.run_id}", column_config=_LAYOUT_COLUMNS)
    with right:
        st.caption(second)
        st.dataframe(fb.layout_frame(preview.get("rebuilt")), hide_index=True,
                     key=f"bkt_rebuilt_{w.run_id}", column_config=_LAYOUT_COLUMNS)
    with st.expander("Every parameter of each rebuilt bucket, in the order DDP reduces them"):
        st.markdown(fb.layout_names(preview.get("rebuilt")) or "no rebuilt layout in the preview")
    seen = ", ".join(f"step {s}: {fb.buckets_text(len(b))}" for s, b in measured.items())
    if seen:
        st.caption(f"Measured in this run (rank 0, when the layout appeared or changed): {seen}; "
                   "the tables above are the preview.")


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
    step = step_selector(windows, "buckets_step")
    if step is None:
        st.info("Waiting for the first complete step of bucket events…",
                icon=":material/hourglass_empty:")
        return
    side_by_side(windows, labels, step)
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
