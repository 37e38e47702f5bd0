"""Runs page: every past run, newest first; open one or two in Live, cancel running ones."""

from __future__ import annotations

import streamlit as st

from app import frames
from app.connection import require_client

LIVE_PAGE = "views/live.py"
ACTIVE = ("queued", "started")


def runs_table(runs: list[dict]) -> list[str]:
    """The table (with an 'open' link per row); returns the ids of the selected rows."""
    df = frames.runs_frame(runs)
    df.insert(0, "open", [f"live?runs={rid}" for rid in df["run_id"]])
    event = st.dataframe(
        df, key="runs_table", hide_index=True, on_select="rerun", selection_mode="multi-row",
        column_config={
            "open": st.column_config.LinkColumn("open", display_text="Live ↗", width="small"),
            "run_id": st.column_config.TextColumn("run id"),
            "world_size": st.column_config.NumberColumn("world size", format="%d"),
            "samples_per_s": st.column_config.NumberColumn("samples/s", format="%.0f",
                                                           help="median over steps after warm-up"),
            "created": st.column_config.DatetimeColumn("created", format="YYYY-MM-DD HH:mm:ss"),
        })
    rows = event.selection.rows if event is not None else []
    return [df["run_id"].iloc[i] for i in rows]


def actions(client, runs: list[dict], selected: list[str]) -> None:
    """'Open in Live' for one or two selected runs; 'Cancel' for selected runs still active."""
    status = {r["run_id"]: r.get("status") for r in runs}
    active = [rid for rid in selected if status.get(rid) in ACTIVE]
    left, right, _ = st.columns([1, 1, 3])
    if left.button("Open in Live", key="open_live", disabled=not 1 <= len(selected) <= 2,
                   help="select one or two rows", width="stretch"):
        st.session_state["live_runs"] = selected
        st.switch_page(LIVE_PAGE, query_params={"runs": ",".join(selected)})
    if right.button(f"Cancel {len(active)} running", key="cancel_runs", disabled=not active,
                    width="stretch"):
        for rid in active:
            st.toast(f"{rid}: {client.cancel(rid)}")
        st.rerun()


st.title("Runs")
client = require_client()
limit = st.columns([1, 5])[0].selectbox("show the newest", [25, 50, 100, 250, 500], index=2,
                                        key="runs_limit")
runs = client.list_runs(limit=limit)
if not runs:
    st.info("No runs yet: launch one on the Launch page.")
    st.page_link("views/launch.py", label="Launch a run", icon=":material/rocket_launch:")
    st.stop()
selected = runs_table(runs)
actions(client, runs, selected)
st.caption(f"{len(runs)} runs · select rows to open them in Live or cancel them · "
           "workers: " + (", ".join(str(w.get("name", w)) for w in client.workers()) or "none"))
