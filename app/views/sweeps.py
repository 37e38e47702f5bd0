"""Sweeps: one click launches a grid of runs; the charts show how they scale.

World sizes × modes (plus a single-device baseline) give scaling efficiency vs world size;
bucket_cap_mb values give step time vs bucket size; model shapes (width × depth) give DP's
measured GIL wait beside the DDP ÷ DP throughput ratio. Runs go through the queue like any other
(`workers.sweeps.submit_sweep`, one group per sweep); the charts fill in as runs finish.
"""

from __future__ import annotations

import streamlit as st

from ddpviz.app.charts import sweeps as cs
from ddpviz.app.connection import require_client
from ddpviz.app.frames import sweeps as fs
from ddpviz.app.outage import guarded
from ddpviz.app.widgets import quick_fields, show_errors
from ddpviz.engine.config import ConfigError
from ddpviz.workers.sweeps import list_sweeps, submit_sweep, sweep_kind, sweep_runs

REFRESH_S = 2.0
RUNS_SCANNED = 500  # newest runs searched for sweeps
KINDS = {"world_size": "world sizes × modes (scaling efficiency)",
         "bucket_cap_mb": "bucket_cap_mb values (step time vs bucket size)",
         "shape": "model shapes, width×depth (GIL wait vs DDP ÷ DP)"}
DEFAULT_VALUES = {"world_size": "1, 2", "bucket_cap_mb": "0.01, 0.1, 1, 25",
                  "shape": "16x16, 64x8, 256x4, 1024x2"}
ACTIVE = ("queued", "started")


def launch_form(client) -> None:
    kind = st.radio("Sweep over", list(KINDS), format_func=KINDS.get, horizontal=True,
                    key="sweep_kind")
    with st.form("sweep_launch"):
        text = st.text_input("values (comma-separated)", value=DEFAULT_VALUES[kind],
                             key=f"sweep_values_{kind}",
                             help="world sizes: whole numbers; bucket caps: MiB; shapes: WIDTHxDEPTH")
        swept = {"world_size": ("world_size",), "bucket_cap_mb": ("bucket_cap_mb",),
                 "shape": ("width", "depth")}[kind]
        values = quick_fields("swp", [f for f in ("model", "dataset", "width", "depth",
                                                  "global_batch_size", "steps", "world_size",
                                                  "bucket_cap_mb", "step_delay_s")
                                      if f not in swept],
                              columns=4, overrides={"steps": 30, "step_delay_s": 0.0})
        go = st.form_submit_button("Launch sweep", type="primary", key="sweep_launch")
    if go:
        try:
            sweep = submit_sweep(client, values, kind, fs.parse_values(text, kind))
        except ConfigError as exc:
            show_errors(exc.errors)
            return
        except ValueError as exc:
            st.error(f"Not launched: {exc}", icon=":material/warning:")
            return
        st.session_state["sweep_pick"] = sweep
        st.toast(f"Launched sweep {sweep}")


def pick_sweep(sweeps: dict[str, list[dict]]) -> str:
    options = list(sweeps)
    if st.session_state.get("sweep_pick") not in sweeps:
        st.session_state["sweep_pick"] = options[0]

    def describe(sid: str) -> str:
        runs = sweeps[sid]
        done = sum(r.get("status") == "succeeded" for r in runs)
        return f"{sid} — {KINDS.get(sweep_kind(sid), '?')} — {done}/{len(runs)} finished"

    return st.selectbox("Sweep", options, key="sweep_pick", format_func=describe)


@guarded
def results(client, sweep_id: str) -> None:
    """Status table and the charts of one sweep (re-read every tick while runs are active)."""
    runs = sweep_runs(client, sweep_id, limit=RUNS_SCANNED)
    df = fs.sweep_frame(runs)
    kind = sweep_kind(sweep_id)
    if kind == "world_size":
        eff = fs.efficiency_frame(df)
        left, right = st.columns(2)
        if eff.empty:
            st.info("Waiting for the first finished run…", icon=":material/hourglass_empty:")
        else:
            with left:
                st.altair_chart(cs.efficiency_chart(eff.dropna(subset=["efficiency"])),
                                key="sweep_eff")
            with right:
                st.altair_chart(cs.throughput_vs_world_chart(eff), key="sweep_tput")
    elif kind == "shape":
        shapes = fs.shape_frame(df)
        if shapes.empty:
            st.info("Waiting for a shape's DP and DDP runs to finish…", icon=":material/hourglass_empty:")
        else:
            left, right = st.columns(2)
            with left:
                st.altair_chart(cs.shape_gil_chart(shapes.dropna(subset=["dp_gil_share", "ddp_over_dp"])),
                                key="sweep_shape_gil")
            with right:
                st.altair_chart(cs.shape_share_chart(shapes), key="sweep_shape_share")
            st.caption("GIL wait: the time DP's device threads (DDP: each rank's training thread) were "
                       "blocked inside their phases, neither running nor waiting for a CPU — measured "
                       "from each thread's CPU clock and schedstat run-queue wait; the median over "
                       "steady steps, averaged over devices.")
    else:
        long = fs.bucket_sweep_frame(df)
        if long.empty:
            st.info("Waiting for the first finished run…", icon=":material/hourglass_empty:")
        else:
            st.altair_chart(cs.bucket_sweep_chart(long), key="sweep_bucket")
    small = dict(width="small")
    # the label names each run (its id is on the Runs page): the table fits 1,400 px without it
    st.dataframe(df.drop(columns=["overlap", "run_id"]), hide_index=True, key="sweep_table", placeholder="—",
                 column_config={
                     "mode": st.column_config.TextColumn("mode", **small),
                     "world_size": st.column_config.NumberColumn("devices", format="%d", **small),
                     "bucket_cap_mb": st.column_config.NumberColumn("cap (MiB)", format="%g", **small),
                     "status": st.column_config.TextColumn("status", **small),
                     "samples_per_s": st.column_config.NumberColumn("samples/s", format="%,.0f", **small),
                     "step_time_ms": st.column_config.NumberColumn("step (ms)", format="%.2f", **small),
                     "comm_exposed_ms": st.column_config.NumberColumn(
                         "comm (ms)", format="%.2f", **small,
                         help="DDP, FSDP: collective time not hidden behind backward (exposed); DP: its "
                              "scatter/gather/reduce/broadcast, copies through device 0"),
                     "overlap_frac": st.column_config.NumberColumn(
                         "overlap", format="percent", **small,
                         help="DDP: share of its all-reduce hidden behind backward (blank: not measured); "
                              "DP has no all-reduce to overlap"),
                     "width": st.column_config.NumberColumn("width", format="%d", **small),
                     "depth": st.column_config.NumberColumn("depth", format="%d", **small),
                     "gil_wait_share": st.column_config.NumberColumn("GIL wait", format="percent", **small)})
    st.caption("— marks what a run has not: comm on one device without collectives (single, and DP ×1, which runs the "
               "module itself as torch's DataParallel does; DDP ×1 still all-reduces, over a group of one); overlap for DP and "
               "single (no all-reduce to hide), and for a DDP or FSDP run whose overlap was not measured (its Live "
               "page says why); GIL wait where no thread was metered.")
    active = int(df["status"].isin(ACTIVE).sum())
    if active:
        st.caption(f"{active} run(s) still queued or running: the charts fill in as they finish.")
    elif st.session_state.get("sweep_live"):  # all done: one full rerun stops the polling
        st.session_state["sweep_live"] = False
        st.rerun()


st.title("Sweeps")
st.caption("Launch a grid of runs with one click and see how throughput scales.")
client = require_client()
sweeps = list_sweeps(client, limit=RUNS_SCANNED)
with st.expander("Launch a sweep", expanded=not sweeps, icon=":material/rocket_launch:"):
    launch_form(client)
sweeps = list_sweeps(client, limit=RUNS_SCANNED)
if not sweeps:
    st.info("No sweeps yet: launch one above.", icon=":material/info:")
    st.stop()
sweep_id = pick_sweep(sweeps)
live = any(r.get("status") in ACTIVE for r in sweeps[sweep_id])
st.session_state["sweep_live"] = live
st.fragment(results, run_every=REFRESH_S if live else None)(client, sweep_id)
