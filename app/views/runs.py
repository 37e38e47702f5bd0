"""Runs page: the history (kept in Redis, so it survives restarts), filtered; act on selected rows.

Select rows to open them in Live or Compare, cancel, re-run with the same config, re-queue a run
whose worker was lost, pin or unpin (retention keeps pinned runs), delete, or (one row) download
its events as JSONL, CSV or a Chrome trace. The retention policy the workers apply is stated
above the table.
"""

from __future__ import annotations

import time

import streamlit as st

from ddpviz.app import panels, runsets
from ddpviz.app.connection import require_client
from ddpviz.app.exports import export_files
from ddpviz.app.frames import runs as fruns
from ddpviz.workers.history import RunActive, delete_run, rerun

LIVE_PAGE = "views/live.py"
COMPARE_PAGE = "views/compare.py"
ACTIVE = ("queued", "started")
STATUSES = ["queued", "started", "succeeded", "failed", "canceled", "lost"]


def filters(df):
    """Status, mode, model and free-text filters; returns the matching rows."""
    c1, c2, c3, c4, c5 = st.columns([1, 1.3, 1, 1, 1.6])
    c1.selectbox("show the newest", [25, 50, 100, 250, 500], index=2, key="runs_limit")
    statuses = c2.multiselect("status", sorted(set(STATUSES) | set(df["status"].dropna())),
                              key="runs_status")
    modes = c3.multiselect("mode", ["single", "dp", "ddp", "fsdp"], key="runs_mode")
    models = c4.multiselect("model", sorted(df["model"].dropna().unique()), key="runs_model")
    text = c5.text_input("search", key="runs_text", placeholder="id, label or model")
    return fruns.filter_runs(df, statuses=statuses, modes=modes, models=models, text=text)


def runs_table(df) -> list[str]:
    """The table (with an 'open' link per row); returns the ids of the selected rows."""
    df = df.copy()
    df.insert(0, "open", [f"live?runs={rid}" for rid in df["run_id"]])
    keep_selection(list(df["run_id"]))
    event = st.dataframe(
        df, key="runs_table", hide_index=True, on_select="rerun", selection_mode="multi-row",
        # what a row is and how it did first, then when, pinned, accuracy and model: widths in px so a 1,500 px
        # window shows those with the whole run id (16 characters, what `ddpviz export` takes); source and note
        # come into view by scrolling right
        column_order=["open", "run_id", "label", "mode", "world_size", "status", "samples_per_s", "wall_s", "created",
                      "pinned", "val_accuracy", "model", "source", "note"],
        placeholder="—",  # a run without samples/s: a dash, and `note` says why
        column_config={
            "open": st.column_config.LinkColumn("open", display_text="Live ↗", width=64),
            "run_id": st.column_config.TextColumn("run id", width=142),
            # a tune's label shows its whole id ("tune fa58b4be1e · ..."; 100 px cut it, 2026-12-06), val acc. stays in view
            "label": st.column_config.TextColumn("label", width=180),
            "mode": st.column_config.TextColumn("mode", width=56),
            "model": st.column_config.TextColumn("model", width=64),
            "status": st.column_config.TextColumn("status", width=86),
            "world_size": st.column_config.NumberColumn("devices", format="%d", width=64,
                                                        help="world size; a single run: one device"),
            "samples_per_s": st.column_config.NumberColumn("samples/s", format="%,.0f", width=82,
                                                           help="median over steps after warm-up"),
            "val_accuracy": st.column_config.NumberColumn("val acc.", format="%.3f", width=66,
                                                          help="final validation accuracy (blank: no evaluation)"),
            "wall_s": st.column_config.NumberColumn("wall (s)", format="%.1f", width=66,
                                                    help="measured: the run's end minus its start, as recorded; the two runs of a "
                                                         "DP/DDP pair train in turns, so each one's wall time "
                                                         "holds the other's turns too: compare samples/s"),
            "note": st.column_config.TextColumn("note", width="small", help="why a run has no samples/s"),
            "source": st.column_config.TextColumn("source", width="small", help="launched by ddpviz, or attached: "
                                                  "a script run under `ddpviz run` (its file and host)"),
            "created": st.column_config.DatetimeColumn("created", format="MM-DD HH:mm:ss", width=118),
            "pinned": st.column_config.CheckboxColumn("pinned", width=60,
                                                      help="kept whatever the retention policy"),
        })
    st.caption("samples/s is the run's own pace (median over its steps after warm-up); wall time includes "
               "everything from start to end: the two runs of a DP/DDP pair train in turns, so each one's "
               "wall time also holds the other's turns.")
    rows = event.selection.rows if event is not None else []
    return [df["run_id"].iloc[i] for i in rows if i < len(df)]


def keep_selection(shown: list[str]) -> None:
    """Keep the table's selection on the same runs when its rows moved since the last render (a new run on top, a
    filter, a deletion): the selection Streamlit keeps is row positions (`frames.runs.remap_selection`), so it is
    set again, by run id, through the table's Session State key before the table is drawn."""
    before = st.session_state.get("runs_table_shown")
    st.session_state["runs_table_shown"] = shown
    state = st.session_state.get("runs_table")
    if before is None or before == shown or state is None:
        return
    rows = list(state["selection"]["rows"])
    moved = fruns.remap_selection(before, rows, shown)
    if moved != rows:
        st.session_state["runs_table"] = {"selection": {"rows": moved, "columns": []}}


def retention_note(client) -> None:
    """What the workers' retention policy keeps (workers.retention), as the workers published it."""
    policy = getattr(client, "retention_policy", lambda: None)()
    if policy is None:
        st.caption("Retention: no worker has published a policy yet, so nothing is deleted.")
    else:
        st.caption(f"Retention: {policy['text']} (set by worker {policy['worker']}; "
                   f"`ddpviz worker --keep-runs N --keep-days D`).")


def pin_button(client, col, pinned: dict[str, bool], selected: list[str]) -> None:
    """Pin the selected runs, or unpin them when every one of them is pinned already."""
    unpin = bool(selected) and all(pinned.get(rid) for rid in selected)
    verb = "Unpin" if unpin else "Pin"
    if col.button(f"{verb} {len(selected)}", key="pin_runs", disabled=not selected, width="stretch",
                  help="pinned runs are never deleted by retention"):
        for rid in selected:
            client.pin(rid, not unpin)
        st.rerun()


def actions(client, status: dict[str, str], selected: list[str],
            pinned: dict[str, bool] | None = None) -> None:
    """One row of buttons acting on the selected runs."""
    active = [rid for rid in selected if status.get(rid) in ACTIVE]
    ended = [rid for rid in selected if status.get(rid) not in ACTIVE]
    lost = [rid for rid in selected if status.get(rid) == "lost"]
    cols = st.columns([1, 1, 1.3, 1, 1.2, 0.8, 1])  # the longer labels get the room
    if cols[0].button("Open in Live", key="open_live", disabled=not 1 <= len(selected) <= 2,
                      help="select one or two rows", width="stretch"):
        st.session_state["live_runs"] = selected
        st.switch_page(LIVE_PAGE, query_params={"runs": ",".join(selected)})
    if cols[1].button("Compare", key="open_compare", disabled=not selected,
                      help="open the selected runs side by side", width="stretch"):
        st.switch_page(COMPARE_PAGE, query_params={"runs": ",".join(selected)})
    if cols[2].button(f"Cancel {len(active)} running", key="cancel_runs", disabled=not active,
                      width="stretch"):
        for rid in active:
            st.toast(f"{rid}: {client.cancel(rid)}")
        st.rerun()
    if cols[3].button(f"Re-run {len(selected)}", key="rerun_runs", disabled=not selected,
                      help="submit the same config again (new run ids)", width="stretch"):
        for rid in selected:
            st.toast(f"{rid} re-run as {rerun(client, rid)}")
        st.rerun()
    requeue = getattr(client, "requeue", None)
    if requeue is not None and cols[4].button(f"Re-queue {len(lost)} lost", key="requeue_runs",
                                              disabled=not lost, width="stretch",
                                              help="runs whose worker died: queue them again"):
        for rid in lost:
            st.toast(f"{rid} re-queued as {requeue(rid)}")
        st.rerun()
    if hasattr(client, "pin"):
        pin_button(client, cols[5], pinned or {}, selected)
    with cols[6].popover(f"Delete {len(ended)}", disabled=not ended, width="stretch"):
        st.write(f"Delete {len(ended)} run(s) and their events for good?")
        if st.button("Delete", key="delete_runs", type="primary"):
            for rid in ended:
                try:
                    delete_run(client, rid)
                except RunActive as exc:
                    st.toast(str(exc))
            st.rerun()


def newest_pair_ids(runs: list[dict]) -> list[str]:
    """The newest DP and DDP runs launched together (one group), else the newest of each mode."""
    by_group: dict[str, dict[str, str]] = {}
    for r in runs:  # newest first
        mode = (r.get("config") or {}).get("mode")
        if mode in ("dp", "ddp") and r.get("group"):
            by_group.setdefault(r["group"], {}).setdefault(mode, r["run_id"])
            if len(by_group[r["group"]]) == 2:
                return [by_group[r["group"]]["dp"], by_group[r["group"]]["ddp"]]
    newest: dict[str, str] = {}
    for r in runs:
        mode = (r.get("config") or {}).get("mode")
        if mode in ("dp", "ddp"):
            newest.setdefault(mode, r["run_id"])
    return [newest["dp"], newest["ddp"]] if len(newest) == 2 else []


def downloads(client, run_id: str) -> None:
    """JSONL, CSV and Chrome-trace downloads of one run (files made on click)."""
    st.markdown(f"**Export `{run_id}`**")
    cols = st.columns(4)
    for col, f in zip(cols, export_files(client, run_id)):
        col.download_button(f.label, data=f.make, file_name=f.file_name, mime=f.mime,
                            key=f"dl_{f.file_name}", icon=":material/download:",
                            on_click="ignore", width="stretch")
    cols[3].caption("The trace opens in ui.perfetto.dev or chrome://tracing: one track per "
                    "rank/device.")


st.title("Runs")
client = require_client()
runs = client.list_runs(limit=st.session_state.get("runs_limit", 100))  # its widget is below
if not runs:
    st.info("No runs yet: launch one on the Launch page.")
    st.page_link("views/launch.py", label="Launch a run", icon=":material/rocket_launch:")
    st.stop()
retention_note(client)
# the table is read when the page runs (any click on it re-reads): a run submitted elsewhere, or one that ended since,
# shows after a refresh (a new user waited for a re-run's "queued" to change, 2026-12-06)
was, refresh = st.columns([5, 1])
was.caption(f"Runs as of {time.strftime('%H:%M:%S')} (this page does not refresh by itself).")
refresh.button("Refresh", key="runs_refresh", icon=":material/refresh:", width="stretch")
pair_ids = newest_pair_ids(runs)
if pair_ids:
    pair_windows = runsets.windows_for(pair_ids)
    panels.refresh(client, pair_windows)
    # which pair the verdict is about: above a table of many runs, "No verdict: DDP ended early" named none (a new
    # user, 2026-12-06)
    st.caption(f"The newest DP and DDP pair: DP `{pair_ids[0]}`, DDP `{pair_ids[1]}`.")
    panels.show_verdict(pair_windows, runsets.unique_labels([r for r in runs if r["run_id"] in pair_ids]))
shown = filters(fruns.runs_frame(runs))
selected = runs_table(shown)
actions(client, {r["run_id"]: r.get("status") for r in runs}, selected,
        {r["run_id"]: bool(r.get("pinned")) for r in runs})
if len(selected) == 1:
    chosen = next((r for r in runs if r["run_id"] == selected[0]), {})
    if chosen.get("error"):  # what Launch promises the Runs page keeps: the whole error of a run that failed
        panels.show_error(chosen["error"], chosen.get("status") or "failed", (chosen.get("config") or {}).get("mode"))
    downloads(client, selected[0])
st.caption(f"{len(shown)} of {len(runs)} runs shown · select rows to act on them · workers: "
           + (", ".join(str(w.get("name", w)) for w in client.workers()) or "none"))
