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
# the runs chart's window: a run still running at its start or started after it is drawn, so a new pair is not a
# sliver at the end of the whole history (None: every run of the latest RUNS_SHOWN)
WINDOWS_S = {"15 min": 15 * 60.0, "1 hour": 3600.0, "1 day": 86400.0, "all runs": None}
DEFAULT_WINDOW = "1 hour"


@guarded
def workers_panel(client) -> None:
    """Workers table and GPU chart, refreshed every `REFRESH_S` seconds."""
    now = time.time()
    workers = client.workers()
    running = {r for w in workers for r in str(w.get("current_run") or "").split(",") if r}
    labels = {r: (client.get_run(r) or {}).get("label") or "" for r in running}
    df = fc.workers_frame(workers, now, labels)
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
    window = st.segmented_control("Time window of the runs chart", list(WINDOWS_S), default=DEFAULT_WINDOW,
                                  key="cluster_window", required=True) or DEFAULT_WINDOW
    window_s = WINDOWS_S[window]
    runs = fc.worker_runs_frame(client.list_runs(limit=RUNS_SHOWN), now,
                                since=None if window_s is None else now - window_s)
    if not runs.empty:
        span = None if window_s is None else (*fc.runs_axis(runs, now, window_s), window)
        st.altair_chart(cc.worker_runs_chart(runs, span), key="cluster_runs")
    else:
        st.caption(f"No run on any worker in the last {window}: pick a longer window above.")


st.title("Cluster")
st.caption(f"Workers announce themselves with a heartbeat; this page refreshes every "
           f"{REFRESH_S:g} s.")
client = require_client()
st.fragment(workers_panel, run_every=REFRESH_S)(client)
