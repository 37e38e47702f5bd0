"""Live page: one or two runs side by side; the status panel refreshes twice a second, the charts
every `REFRESH_S`, the per-device detail every `DETAIL_REFRESH_S`.

Which runs: `?runs=id1,id2` in the URL, else the ids the Launch/Runs page left in
`st.session_state["live_runs"]`, else the latest pair (the newest run and its group mate).
Each panel is its own `st.fragment`: the status panel (badge, "step i / N") every
`STATUS_REFRESH_S`, so a new step shows within about that (`ddpviz bench`, figure 2: p95 <= 1 s),
and the charts every `REFRESH_S`, since a chart that moved a fraction of a step tells a person no
more. The page shares the machine with the runs it shows: with Live open on the default pair in
headless Chromium on 2 cores (tests/app/default_pair_tries.py), Streamlit took 0.25 and Chromium
0.30 CPU s per s of training with the charts every 1 s; with the charts every 2 s and the detail
every 4 s, 0.20-0.31 and 0.23-0.32 (6 tries, load averages 11-15: no cut the load's noise lets one
see); with the status panel every 2 s too, 0.23 and 0.26 (one try; the 0.5 s panel is what
`ddpviz bench` figure 2 needs). Server CPU per refresh (AppTest, a 300-step pair): memory 115 ms,
throughput 90, each detail 82, split 46, status 1; Streamlit's own chart marshalling ~11 ms a chart.
The verdict is worked out again only when new events arrived (`app.explain.pair_verdict`).
Once every shown run is terminal and its stream is drained, the page reruns once with
`run_every=None` and stops polling.
"""

from __future__ import annotations

import streamlit as st

from ddpviz.app import panels, panels_memory, runsets
from ddpviz.app.connection import require_client
from ddpviz.app.frames import base as frames
from ddpviz.app.window import RunWindow

REFRESH_S = 2.0  # charts
DETAIL_REFRESH_S = 4.0  # the per-device detail (a typical step's buckets, phases, bytes)
STATUS_REFRESH_S = 0.5  # status badge and step counter: cheap (no charts)
MAX_RUNS = 2


def wanted_runs(runs: list[dict]) -> list[str]:
    """Runs asked for by the URL, else by another page, else the latest pair."""
    from_url = [i for i in st.query_params.get("runs", "").split(",") if i]
    if from_url:
        return from_url[:MAX_RUNS]
    if "live_runs" in st.session_state:  # an empty choice made here is kept
        return st.session_state["live_runs"][:MAX_RUNS]
    return runsets.latest_pair(runs, MAX_RUNS)


def pick_runs(client) -> list[str]:
    """The run picker; its choice is mirrored into the URL so the view can be shared."""
    runs = client.list_runs(limit=100)
    by_id = {r["run_id"]: r for r in runs}
    wanted = wanted_runs(runs)
    missing = [i for i in wanted if i not in by_id and client.get_run(i) is None]
    if missing:
        st.warning("No such run: " + ", ".join(f"`{i}`" for i in missing),
                   icon=":material/search_off:")
        wanted = [i for i in wanted if i not in missing]
    if wanted != st.session_state.get("live_wanted"):  # a new request overrides the picker
        st.session_state["live_wanted"] = wanted
        st.session_state["live_pick"] = wanted
    options = list(dict.fromkeys(wanted + list(by_id)))
    # no status here: the badges below stay current, this doesn't; two runs of one label tell apart
    names = runsets.picker_labels([{**(by_id.get(rid) or client.get_run(rid) or {}), "run_id": rid} for rid in options])
    picked = st.multiselect("Runs (one or two)", options, key="live_pick",
                            max_selections=MAX_RUNS, format_func=names.get)
    if picked:
        st.query_params["runs"] = ",".join(picked)
    elif "runs" in st.query_params:
        del st.query_params["runs"]
    st.session_state["live_runs"] = picked
    st.session_state["live_wanted"] = picked
    return picked


def windows_for(ids: list[str]) -> dict[str, RunWindow]:
    """The `RunWindow` of each id, kept across reruns in session state."""
    store = st.session_state.setdefault("windows", {})
    for rid in ids:
        store.setdefault(rid, RunWindow(rid))
    return {rid: store[rid] for rid in ids}


def unique_labels(client, windows: dict[str, RunWindow]) -> dict[str, str]:
    """Legend name per run, made unique when two runs share a label."""
    labels = {rid: frames.run_label(w.run or client.get_run(rid), rid)
              for rid, w in windows.items()}
    if len(set(labels.values())) < len(labels):
        labels = {rid: f"{lab} · {rid[:6]}" for rid, lab in labels.items()}
    return labels


def status_fragment(client, windows, labels) -> None:
    """Status badges; triggers the one full rerun that stops polling when all runs are done."""
    panels.status_panel(client, windows, labels)
    if st.session_state.get("live_polling") and panels.all_done(windows):
        st.session_state["live_polling"] = False
        st.rerun()


st.title("Live")
client = require_client()
ids = pick_runs(client)
if not ids:
    # with runs stored, an empty pick (or an unknown id, warned above) is a choice to make, not "no runs"
    if client.list_runs(limit=1):
        st.info("Pick one or two runs above to watch.", icon=":material/touch_app:")
        st.stop()
    st.info("No runs yet: launch one on the Launch page.")
    st.page_link("views/launch.py", label="Launch a run", icon=":material/rocket_launch:")
    st.stop()

windows = windows_for(ids)
panels.refresh(client, windows)
labels = unique_labels(client, windows)
live = not panels.all_done(windows)
st.session_state["live_polling"] = live
every = REFRESH_S if live else None
args = (client, windows, labels)

st.fragment(panels.verdict_panel, run_every=every)(*args)  # first under the title
st.fragment(status_fragment, run_every=STATUS_REFRESH_S if live else None)(*args)
left, right = st.columns([3, 2])
with left:
    st.fragment(panels.throughput_panel, run_every=every)(*args)
    st.fragment(panels.accuracy_panel, run_every=every)(*args)  # same step axis, same width
with right:
    st.fragment(panels.split_panel, run_every=every)(*args)
st.fragment(panels_memory.memory_panel, run_every=every)(*args)
st.subheader("A typical step, per device")
for col, rid in zip(st.columns(len(ids)), ids):
    with col:
        st.fragment(panels.detail_panel, run_every=DETAIL_REFRESH_S if live else None,
                    key=f"detail_{rid}")(*args, rid)
