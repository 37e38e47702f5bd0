"""Cluster page: the workers that run jobs, their devices, heartbeats and current runs, live GPU
memory and utilisation from NVML where a worker has GPUs, and which runs each worker ran."""

from __future__ import annotations

import time

import streamlit as st

from ddpviz.app.charts import cluster as cc
from ddpviz.app.connection import require_client
from ddpviz.app.frames import cluster as fc
from ddpviz.app.outage import guarded

REFRESH_S = 2.0
STALE_S = 10.0  # a heartbeat older than this is flagged (workers beat every few seconds)
RUNS_SHOWN = 200


@guarded
def workers_panel(client) -> None:
    """Workers table and GPU chart, refreshed every `REFRESH_S` seconds."""
    now = time.time()
    workers = client.workers()
    df = fc.workers_frame(workers, now)
    if df.empty:
        st.warning("No live worker: start one with `ddpviz worker` (runs stay queued until one "
                   "is up).", icon=":material/dns:")
    else:
        stale = df[df["heartbeat_age_s"].fillna(0) > STALE_S]
        st.dataframe(df, hide_index=True, key="cluster_workers", column_config={
            "heartbeat_age_s": st.column_config.NumberColumn("heartbeat age (s)", format="%.1f"),
            "current_run": st.column_config.TextColumn("current run"),
            "gpus": st.column_config.TextColumn("GPUs (NVML)", width="medium")})
        if not stale.empty:
            st.warning("No recent heartbeat from: " + ", ".join(stale["name"]),
                       icon=":material/heart_broken:")
    gpus = fc.gpu_frame(workers)
    if not gpus.empty:
        st.altair_chart(cc.gpu_memory_chart(gpus), key="cluster_gpus")
    elif not df.empty:
        st.caption("CPU only: no worker reports an NVIDIA GPU (NVML), so there is no GPU memory "
                   "or utilisation to show.")
    runs = fc.worker_runs_frame(client.list_runs(limit=RUNS_SHOWN), now)
    if not runs.empty:
        st.altair_chart(cc.worker_runs_chart(runs), key="cluster_runs")


st.title("Cluster")
st.caption(f"Workers announce themselves with a heartbeat; this page refreshes every "
           f"{REFRESH_S:g} s.")
client = require_client()
st.fragment(workers_panel, run_every=REFRESH_S)(client)
