"""Compare page: a single/DP/DDP/FSDP set (same config and seed) side by side.

Pick a set of runs launched together (or launch one here), then read: peak memory per device and
its imbalance (the headline), samples/s and the speed-up over one device, the step-time split,
bytes per device per step against the formula, overlap, whether the replicas stayed in sync — and
the throughput and loss curves on one step axis.
"""

from __future__ import annotations

import streamlit as st

from ddpviz.app import explain, panels, runsets
from ddpviz.app.charts import compare as charts_compare
from ddpviz.app.charts import steps as charts
from ddpviz.app.connection import require_client
from ddpviz.app.frames import steps as fsteps
from ddpviz.app.frames.compare import (
    buffers_frame,
    bytes_frame,
    compare_frame,
    curves_frame,
    peak_memory_frame,
    side_by_side,
    view_of,
)
from ddpviz.app.widgets import plain, quick_fields, show_errors
from ddpviz.engine.config import ConfigError
from ddpviz.workers.sweeps import submit_trio

_BUFFER_COLUMNS = {
    "at_forward_start": st.column_config.NumberColumn("Σ at forward start", format="%.6g"),
    "after_step": st.column_config.NumberColumn("Σ after the step", format="%.6g"),
    "as_rank0_at_forward": st.column_config.CheckboxColumn("= rank 0 at forward start")}



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
    with verdict_slot.container():
        panels.show_verdict(windows, labels)
    views = [view_of(w, labels[rid]) for rid, w in windows.items()]
    table = compare_frame(views)
    headline(table)
    peaks = peak_memory_frame(views)
    if not peaks.empty:
        st.altair_chart(charts_compare.peak_memory_chart(peaks, {v.label: v.mode for v in views}),
                        key="cmp_memory")
    rows = side_by_side(table)
    # a static table: its cells wrap, so a long value ("rebuilt each step; as computed with: yes",
    # "unlabelled (older run)") is read whole, never cut at a column's edge as a data grid cuts it
    indented = rows["measure"].str.replace(r"^  ", "\u2003", regex=True)  # HTML collapses plain spaces
    st.table(rows.assign(measure=indented), hide_index=True, border="horizontal")
    st.caption(explain.MEANS_AND_MEDIANS)
    if any((w.started or {}).get("emulated") for w in windows.values()):
        st.caption(explain.EMULATION_NOTE)
    curves = curves_frame(views)
    modes = {v.label: v.mode for v in views}
    left, right = st.columns(2)
    with left:
        st.altair_chart(charts.throughput_curves_chart(curves, modes=modes), key="cmp_throughput")
    with right:
        st.altair_chart(charts_compare.loss_chart(curves, modes), key="cmp_loss")
    left, right = st.columns(2)
    with left:
        st.altair_chart(charts.split_chart(fsteps.split_frame(curves, modes)), key="cmp_split")
    with right:
        if table["speedup_vs_single"].notna().any():
            st.altair_chart(charts_compare.speedup_chart(table), key="cmp_speedup")
        else:
            st.info("Speed-up needs a finished `single` run in this set: launch a trio above.",
                    icon=":material/info:")
    volume = bytes_frame(views)
    if not volume.empty:
        st.altair_chart(charts_compare.bytes_chart(volume), key="cmp_bytes")
    st.caption("P = gradient bytes. Bytes: DP's are measured (the tensors device 0 copied); DDP's "
               "are the bucket bytes it handed to all-reduce (measured) times the ring factor "
               "2(n−1)/n (derived); FSDP's are its all-gather and reduce-scatter bytes (measured) "
               "times the backend's wire factor (derived); each bar is labelled by the source its own "
               "events give, \"unlabelled\" where an older run's give none. Replicas in sync: DDP compares every "
               "rank's parameter checksum after the step; DP keeps one copy on device 0, rebuilds "
               "its replicas from it every step and checks them after they computed the step (they can "
               "differ only by a write after the copy), and names the buffer updates its replicas made "
               "that it discards; a single "
               "device has nothing to compare, nor has FSDP (each rank holds its own shard).")
    buffers = buffers_frame(views)
    if not buffers.empty:
        st.markdown("**Module buffers per rank (DDP), at the last check**")
        st.dataframe(buffers.drop(columns=["step"]), hide_index=True, key="compare_buffers",
                     column_config=_BUFFER_COLUMNS)
        st.caption("Σ of each buffer's values. With broadcast_buffers on (PyTorch's default) every "
                   "rank starts the forward with rank 0's buffers; each rank's own batch then "
                   "moves its BatchNorm statistics, so after the step they differ.")


def headline(table) -> None:
    """Per run: peak memory of its busiest device (the headline) and samples/s beside it."""
    for col, (_, row) in zip(st.columns(len(table)), table.iterrows()):
        peak, sps, speed = row["peak_mib_max"], row["samples_per_s"], row["speedup_vs_single"]
        rate = "—" if sps != sps else f"{sps:,.0f} samples/s" + ("" if speed != speed else f", {speed:.2f}× single")
        # short: a metric's label is cut with "…" at a quarter of a 1280 px page
        col.metric(f"{plain(row['run'])}: peak memory", "—" if peak != peak else f"{peak:.2f} MiB",
                   delta=rate, delta_color="off", delta_arrow="off",
                   help="peak memory per device: the busiest device's peak, measured (see the "
                        "chart's legend for how)")


st.title("Compare")
verdict_slot = st.empty()  # the DP vs DDP verdict, first under the title, filled once the set is read
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
