"""Theory beside measurement: bandwidth per bucket, the ring cost model, bytes per device.

- Per bucket: algbw (bytes / all-reduce time) and busbw (algbw · 2(n−1)/n, nccl-tests' bus
  bandwidth, comparable to a link's peak).
- The ring all-reduce cost model t = 2(n−1)·α + 2(n−1)/n · bytes/β, fitted by least squares to
  this run's own buckets, drawn through the measured points.
- Bytes per device per step: DP's hub (device 0, measured copies) against DDP's ranks (derived
  from the bytes all-reduced), and by formula.
"""

from __future__ import annotations

import streamlit as st

from app import frames_theory as ft, runsets
from app.charts_compare import bytes_chart
from app.charts_theory import bandwidth_chart, ring_fit_chart
from app.connection import require_client
from app.frames_compare import bytes_frame, view_of


def ddp_section(w, label: str) -> None:
    n = int(w.config.get("world_size") or 1)
    bw = ft.bandwidth_frame(w.of_type("bucket"), n)
    if bw.empty:
        st.info(f"{label}: waiting for bucket events…", icon=":material/hourglass_empty:")
        return
    left, right = st.columns(2)
    with left:
        st.altair_chart(bandwidth_chart(ft.per_bucket(bw), run=label), key=f"th_bw_{w.run_id}")
    model, line = ft.ring_fit(w.of_type("bucket"), n)
    with right:
        st.altair_chart(ring_fit_chart(bw, line, run=label), key=f"th_fit_{w.run_id}")
    if model is None:
        st.caption("The ring model needs buckets of at least two sizes: lower bucket_cap_mb "
                   "so the model's gradients span several buckets.")
    else:
        st.caption(f"Fitted: {ft.describe_fit(model, n)}. On one CPU host the \"link\" is "
                   "loopback through gloo, so α and β describe that, not a network.")


def body(windows, labels) -> None:
    ddp = {rid: w for rid, w in windows.items() if w.mode == "ddp"}
    for rid, w in ddp.items():
        ddp_section(w, labels[rid])
    if not ddp:
        st.info("No DDP run in this set: bandwidth and the ring model need bucket events.",
                icon=":material/info:")
    views = [view_of(w, labels[rid]) for rid, w in windows.items() if w.mode in ("dp", "ddp")]
    volume = bytes_frame(views)
    if not volume.empty:
        st.altair_chart(bytes_chart(volume), key="th_bytes")
        st.caption("DP moves everything through device 0: with n devices it sends and receives "
                   "(n−1)·P while the others move P each. A ring all-reduce spreads the same "
                   "work evenly: 2(n−1)/n·P per rank, never more than 2·P however large n gets.")


st.title("Theory vs measurement")
st.caption("The textbook numbers next to what this run measured.")
client = require_client()
runs = [r for r in runsets.pick_set(client, "theory_set", runsets.has_modes("dp", "ddp"))
        if runsets.mode(r) in ("dp", "ddp")]
runs = runsets.narrow_to_world_size(runs, "theory_ws")
if not runs:
    runsets.no_runs("DP or DDP runs")
    st.stop()
labels = runsets.unique_labels(runs)
windows = runsets.windows_for([r["run_id"] for r in runs])
runsets.live_body(client, windows, lambda: body(windows, labels), key="theory")
