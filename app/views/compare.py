"""Compare page: a single/DP/DDP/FSDP set (same config and seed) side by side.

Pick a set of runs launched together (or launch one here), then read: peak memory per device
(the headline), samples/s and the speed-up over one device, the step-time split, peak memory per device and its imbalance, bytes
per device per step against the formula, overlap, whether the replicas stayed in sync — and the
throughput and loss curves on one step axis.
"""

from __future__ import annotations

import streamlit as st

from app import charts, charts_compare, frames, runsets
from app.connection import require_client
from app.frames_compare import (bytes_frame, compare_frame, curves_frame, peak_memory_frame,
                                side_by_side, view_of)
from app.widgets import quick_fields, show_errors
from engine.config import ConfigError
from workers.sweeps import submit_trio


def launch_trio(client) -> None:
    """A compact form that submits single, DP, DDP and FSDP of one config (one group)."""
    with st.expander("Launch a single / DP / DDP / FSDP set", icon=":material/rocket_launch:"):
        with st.form("compare_launch"):
            values = quick_fields("cmp")
            go = st.form_submit_button("Launch single, DP, DDP and FSDP", type="primary",
                                       key="compare_launch_trio")
        if go:
            try:
                group, ids = submit_trio(client, values)
            except ConfigError as exc:
                show_errors(exc.errors)
                return
            st.session_state["focus_group"] = group
            st.session_state.pop("compare_set", None)
            st.query_params.clear()
            st.toast(f"Launched {', '.join(ids.values())}")
            st.rerun()


def body(windows, labels) -> None:
    """Everything below the picker; redrawn each tick while a run is going."""
    views = [view_of(w, labels[rid]) for rid, w in windows.items()]
    table = compare_frame(views)
    headline(table)
    peaks = peak_memory_frame(views)
    if not peaks.empty:
        st.altair_chart(charts_compare.peak_memory_chart(peaks), key="cmp_memory")
    rows = side_by_side(table)
    st.dataframe(rows, hide_index=True, key="compare_table", height=36 * (len(rows) + 1) + 4)
    curves = curves_frame(views)
    left, right = st.columns(2)
    with left:
        st.altair_chart(charts.throughput_chart(curves), key="cmp_throughput")
    with right:
        st.altair_chart(charts_compare.loss_chart(curves), key="cmp_loss")
    left, right = st.columns(2)
    with left:
        st.altair_chart(charts.split_chart(frames.split_frame(curves)), key="cmp_split")
    with right:
        if table["speedup_vs_single"].notna().any():
            st.altair_chart(charts_compare.speedup_chart(table), key="cmp_speedup")
        else:
            st.info("Speed-up needs a finished `single` run in this set: launch a trio above.",
                    icon=":material/info:")
    volume = bytes_frame(views)
    if not volume.empty:
        st.altair_chart(charts_compare.bytes_chart(volume), key="cmp_bytes")
    st.caption("P = gradient bytes. Replicas in sync: every replica's parameter checksum equal "
               "at the last check (DP: device copies; DDP: ranks; FSDP has no replicas: each rank "
               "holds its own shard, so there is nothing to compare).")


def headline(table) -> None:
    """Per run: peak memory of its busiest device (the headline) and samples/s beside it."""
    for col, (_, row) in zip(st.columns(len(table)), table.iterrows()):
        peak, sps, speed = row["peak_mib_max"], row["samples_per_s"], row["speedup_vs_single"]
        rate = "—" if sps != sps else f"{sps:,.0f} samples/s" + ("" if speed != speed else f", {speed:.2f}× single")
        col.metric(f"{row['run']}: peak memory per device", "—" if peak != peak else f"{peak:.2f} MiB",
                   delta=rate, delta_color="off", delta_arrow="off",
                   help="the busiest device's peak, measured (see the chart's legend for how)")


st.title("Compare")
st.caption("Same config, same seed: one device vs DataParallel vs DistributedDataParallel vs fully "
           "sharded data parallel (FSDP2). Headline: the peak memory of each run's busiest device.")
client = require_client()
launch_trio(client)
runs = runsets.pick_set(client, "compare_set", runsets.has_modes("dp", "ddp"))
if not runs:
    runsets.no_runs("run sets")
    st.stop()
runs = runsets.narrow_to_world_size(runs, "compare_ws")
labels = runsets.unique_labels(runs)
windows = runsets.windows_for([r["run_id"] for r in runs])
runsets.live_body(client, windows, lambda: body(windows, labels), key="compare")
