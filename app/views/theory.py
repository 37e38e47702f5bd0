"""Theory beside measurement: all-reduce bandwidth by message size, the ring cost model, bytes.

- The all-reduce probe (engine/modes/ddp/probe.py, run after training): time, algbw and busbw per message
  size with one collective in flight — the link as nccl-tests would measure it.
- The run's own buckets on the same axes: those that ran alone (measured bandwidths) apart from
  those that overlapped another bucket's all-reduce (gloo runs two at once; not bandwidths).
- The ring all-reduce cost model t = 2(n−1)·α + 2(n−1)/n · bytes/β fitted to the probe and to the
  buckets that ran alone, with α and β, and which points each fit used and why.
- In-run busbw ÷ probe busbw at the same size.
- Bytes per device per step: DP's hub (device 0, measured copies) against DDP's ranks (derived
  from the bytes all-reduced), and by formula.
"""

from __future__ import annotations

import streamlit as st

from ddpviz.app import runsets
from ddpviz.app.charts.compare import bytes_chart
from ddpviz.app.charts.theory import bandwidth_chart, time_chart
from ddpviz.app.connection import require_client
from ddpviz.app.frames import theory as ft
from ddpviz.app.frames.compare import bytes_frame, view_of
from ddpviz.app.widgets import plain
from ddpviz.app.window import TERMINAL


def ddp_section(w, label: str) -> None:
    n = int(w.config.get("world_size") or 1)
    backend = (w.started or {}).get("backend")
    if n <= 1:  # nothing moves: no bandwidth, no ring model (a one-rank all-reduce is a no-op)
        st.info(f"{plain(label)}: {ft.link_note(backend, n)}", icon=":material/info:")
        return
    buckets = w.of_type("bucket")
    bk = ft.bucket_frame(buckets, n, min_step=1)  # step 0: one big bucket, first-call set-up
    probe = ft.latest_probe(w.of_type("allreduce_probe"))
    pf = ft.probe_frame(probe)
    if bk.empty and pf.empty:
        st.info(f"{plain(label)}: waiting for bucket events…", icon=":material/hourglass_empty:")
        return
    model, counts = ft.bucket_fit(buckets, n)
    lines = ft.model_lines({ft.FIT_PROBE: (probe or {}).get("fit"), ft.FIT_BUCKETS: model},
                           *ft.size_range(pf, bk), n)
    # full width, one above the other: six series and their legend need the room
    st.altair_chart(bandwidth_chart(pf, bk, lines, run=label), key=f"th_bw_{w.run_id}")
    st.altair_chart(time_chart(pf, bk, lines, run=label), key=f"th_fit_{w.run_id}")
    if probe:
        st.markdown(ft.probe_note(probe, n))
    elif w.status in TERMINAL:
        st.caption("No all-reduce probe in this run (probe off, world_size 1, or recorded before "
                   "the probe existed): launch it with probe on to see the link measured alone.")
    else:
        st.caption("The all-reduce probe runs after the last training step.")
    st.markdown(ft.bucket_note(model, counts, n, backend))
    if probe:
        st.markdown(ft.ratio_note(ft.ratio_summary(buckets, probe, n), n))
    st.caption(ft.link_note(backend, n, int(w.config.get("nnodes") or 1)))


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
                   "(n−1)·P each way while the others move P each way. A ring all-reduce spreads the "
                   "same work evenly: 2(n−1)/n·P each way per rank, never more than 2·P each way "
                   "however large n gets. The bars add sent and received.")


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
