"""Sets of runs the analysis pages look at, and the bounded windows that hold their events.

A *set* is the runs that share a `group` in their records: a DP/DDP pair, a single/DP/DDP trio,
an overlap on/off pair, or a sweep. Pages pick a set (or runs named in ``?runs=``) and read each
run through a `RunWindow` that keeps more steps of `step` events than Live's (`MAX_STEPS`) and
the same detail steps as Live's (`app.window.DETAIL_TYPES`: the first, a spread, the newest).

Pure helpers (grouping, labels) come first; the Streamlit parts (pickers, polling) after.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any, Callable

import streamlit as st

from ddpviz.app.frames import base as frames
from ddpviz.app.frames.buckets import cap_text
from ddpviz.app.outage import REDIS_DOWN, show_outage
from ddpviz.app.window import RunWindow
from ddpviz.engine.config import RunConfig

MAX_STEPS = 2000  # step and memory events kept per run (charts thin them further)
REFRESH_S = 1.0
POLL_INTERVAL_S = 0.5
MODE_ORDER = {"single": 0, "dp": 1, "ddp": 2, "fsdp": 3}

Run = dict[str, Any]


# ---- pure ---------------------------------------------------------------------------------
def mode(run: Run | None) -> str:
    return ((run or {}).get("config") or {}).get("mode", "?")


def modes_of(windows: dict, labels: dict[str, str]) -> dict[str, str]:
    """Run label -> mode of each window's run (`app.window.RunWindow.run`), for the charts'
    colours (`app.charts.style.run_scale`: one colour per mode on every page)."""
    return {labels.get(rid, rid): mode(w.run) for rid, w in windows.items()}


def groups(runs: list[Run]) -> dict[str, list[Run]]:
    """Every run in a set, newest set first; each set's runs single, dp, ddp. Runs launched
    together share their `group`; a run without one (an attached `ddpviz run` or `ddpviz upload`,
    a run launched alone) is a set of its own, keyed by its run id, so every page's chooser
    offers it."""
    out: dict[str, list[Run]] = {}
    for r in sorted(runs, key=lambda r: -(r.get("created_at") or 0)):
        out.setdefault(r.get("group") or r["run_id"], []).append(r)
    for members in out.values():
        members.sort(key=sort_key)
    return out


def sort_key(run: Run) -> tuple:
    cfg = run.get("config") or {}
    return (MODE_ORDER.get(mode(run), 3), cfg.get("world_size") or 0, not cfg.get("overlap", True),
            cfg.get("bucket_cap_mb") or 0, run.get("created_at") or 0)


# which two runs of a set Live opens on: DP then DDP (the pair the verdict compares), then FSDP, single
PAIR_FIRST = {"dp": 0, "ddp": 1, "fsdp": 2, "single": 3}


def latest_pair(runs: list[Run], most: int = 2) -> list[str]:
    """The newest run and, if it belongs to a group (a DP/DDP pair, a single/DP/DDP/FSDP set), its group
    mates, at most `most` of them, in `PAIR_FIRST` order (before 2026-12-06: DP, then by run id, so a set
    could open on DP and FSDP, with no verdict)."""
    if not runs:
        return []
    newest = max(runs, key=lambda r: r.get("created_at") or 0)
    if not newest.get("group"):
        return [newest["run_id"]]
    return pair_first({r["run_id"]: mode(r) for r in runs if r.get("group") == newest["group"]}, most)


def pair_first(modes: dict[str, str], most: int = 2) -> list[str]:
    """Of runs {run_id: mode}, the first `most` in `PAIR_FIRST` order (DP, DDP, FSDP, single), ties by id."""
    return sorted(modes, key=lambda rid: (PAIR_FIRST.get(modes[rid], len(PAIR_FIRST)), rid))[:most]


def set_label(members: list[Run]) -> str:
    """``"DP · DDP — mlp ×2, 12 steps, bucket cap 0.1 MiB — 08:35:02 (1a2b3c) · failed"``: what a
    picker shows for a set. The DDP run's knobs that differ from the defaults (a preset's) and any
    run that did not succeed are named, so sets of one model tell apart (the tour, issue 33: every
    entry read "DP · DDP — mlp ×2, 300 steps — time")."""
    names = " · ".join(dict.fromkeys(frames.run_label(r, r["run_id"]) for r in members))
    cfg = (members[0].get("config") or {}) if members else {}
    created = min((r.get("created_at") or 0) for r in members) if members else 0
    when = dt.datetime.fromtimestamp(created).strftime("%m-%d %H:%M:%S") if created else "?"
    group = (members[0].get("group") or members[0]["run_id"]) if members else ""
    ddp = next((r.get("config") or {} for r in members if mode(r) == "ddp"), {})
    knobs = "".join(f", {words}" for key, words in (
        ("bucket_cap_mb", f"bucket cap {cap_text(ddp.get('bucket_cap_mb'))} MiB"), ("comm_hook", f"{ddp.get('comm_hook')} hook"),
        ("bucket_timing", f"bucket timing {ddp.get('bucket_timing')}"), ("overlap", "overlap off"))
        if ddp.get(key) is not None and ddp.get(key) != RunConfig.model_fields[key].default)  # None: an attached run's
    bad = sorted({str(r.get("status")) for r in members} & {"failed", "canceled", "lost"})
    # devices as the Runs table counts them (a set's single run: 1, whatever its world_size; a new user saw
    # "single ×1 · ... — mlp ×4" for `--mode single --world-size 4`)
    devices = max((frames.devices_used(r.get("config") or {}) or 0 for r in members), default=0) or "?"
    return (f"{names} — {cfg.get('model')} ×{devices}, {cfg.get('steps')} steps{knobs} "
            f"— {when} ({group[:12]})" + (f" · {', '.join(bad)}" if bad else ""))



def default_group(by_group: dict[str, list[Run]], want: Callable[[list[Run]], bool]) -> str | None:
    """The newest group for which `want(members)` holds, else the newest group."""
    for g, members in by_group.items():
        if want(members):
            return g
    return next(iter(by_group), None)


def has_modes(*modes: str) -> Callable[[list[Run]], bool]:
    """A `want` for `default_group`: the set holds a run of every one of `modes`."""
    return lambda members: set(modes) <= {mode(r) for r in members}


def unique_labels(runs: list[Run]) -> dict[str, str]:
    """Legend name per run id, made unique (id suffix) when two runs share a label."""
    labels = {r["run_id"]: frames.run_label(r, r["run_id"]) for r in runs}
    if len(set(labels.values())) < len(labels):
        labels = {rid: f"{lab} · {rid[:6]}" for rid, lab in labels.items()}
    return labels


def picker_labels(runs: list[Run]) -> dict[str, str]:
    """Run id -> what a run picker shows: the run's label, and where two runs share it (two pairs launched
    without a name are both "DP" and "DDP") its launch time and short id, ``"DDP — 12-06 05:02:57
    (4d2795)"``, so every entry tells its run apart."""
    labels = {r["run_id"]: frames.run_label(r, r["run_id"]) for r in runs}
    shared = {lab for lab, n in Counter(labels.values()).items() if n > 1}
    out = {}
    for r in runs:
        lab = labels[r["run_id"]]
        created = r.get("created_at")
        when = dt.datetime.fromtimestamp(created).strftime("%m-%d %H:%M:%S") if created else "?"
        out[r["run_id"]] = f"{lab} — {when} ({r['run_id'][:6]})" if lab in shared else lab
    return out


# ---- Streamlit ------------------------------------------------------------------------------
def pick_set(client, key: str, want: Callable[[list[Run]], bool], *,
             limit: int = 200) -> list[Run]:
    """The set picker: ``?runs=a,b`` in the URL wins; else a selectbox of sets (default: the
    newest one `want` accepts). Returns the chosen runs' records, ordered single, dp, ddp."""
    from_url = [i for i in st.query_params.get("runs", "").split(",") if i]
    if from_url:
        runs = [client.get_run(i) for i in from_url]
        missing = [i for i, r in zip(from_url, runs) if r is None]
        if missing:
            st.warning("No such run: " + ", ".join(f"`{i}`" for i in missing),
                       icon=":material/search_off:")
        chosen = sorted((r for r in runs if r is not None), key=sort_key)
        st.caption("Runs from the link: " + ", ".join(frames.run_label(r, r["run_id"])
                                                      for r in chosen))
        return chosen
    by_group = groups(client.list_runs(limit=limit))
    if not by_group:
        return []
    options = list(by_group)
    shared = st.session_state.get("focus_group")  # the set chosen on another page
    default = shared if shared in by_group and want(by_group[shared]) else \
        default_group(by_group, want)
    if st.session_state.get(key) not in by_group:
        st.session_state[key] = default
    picked = st.selectbox("Run set (runs launched together share a group)", options, key=key,
                          format_func=lambda g: set_label(by_group[g]))
    st.session_state["focus_group"] = picked
    return by_group[picked]


def narrow_to_world_size(runs: list[Run], key: str) -> list[Run]:
    """A sweep holds several world sizes: pick one (the largest by default); single runs stay."""
    sizes = sorted({(r.get("config") or {}).get("world_size") for r in runs if mode(r) != "single"})
    if len(sizes) <= 1:
        return runs
    n = st.segmented_control("world size", sizes, default=sizes[-1], key=key, required=True)
    return [r for r in runs if mode(r) == "single" or (r.get("config") or {}).get("world_size") == n]


def windows_for(ids: list[str]) -> dict[str, RunWindow]:
    """An analysis `RunWindow` per id, kept across reruns in session state."""
    store = st.session_state.setdefault("analysis_windows", {})
    for rid in ids:
        if rid not in store:
            store[rid] = RunWindow(rid, max_steps=MAX_STEPS)
    return {rid: store[rid] for rid in ids}


def poll(client, windows: dict[str, RunWindow]) -> bool:
    """Read new events of every window; False (after the outage banner) when Redis is down."""
    try:
        for w in windows.values():
            w.poll(client, min_interval_s=POLL_INTERVAL_S)
    except REDIS_DOWN:
        show_outage()
        return False
    return True


def all_done(windows: dict[str, RunWindow]) -> bool:
    return all(w.done for w in windows.values())


def live_body(client, windows: dict[str, RunWindow], body: Callable[[], None], key: str) -> None:
    """Draw `body()` in a fragment that polls `windows` and redraws every `REFRESH_S` seconds
    while any run is still going; when all are done it reruns the page once to stop polling.

    Redis errors inside `body` become the outage banner; the next tick tries again.
    """
    poll(client, windows)
    live = not all_done(windows)
    flag = f"{key}_polling"
    st.session_state[flag] = live

    def tick() -> None:
        if not poll(client, windows):
            return
        try:
            body()
        except REDIS_DOWN:
            show_outage()
            return
        if st.session_state.get(flag) and all_done(windows):
            st.session_state[flag] = False
            st.rerun()

    st.fragment(tick, run_every=REFRESH_S if live else None)()


def no_runs(what: str = "runs") -> None:
    """The empty state: say what is missing and link to where to make it."""
    st.info(f"No {what} yet: launch some on the Launch, Compare or Sweeps page.",
            icon=":material/info:")
    st.page_link("views/launch.py", label="Launch a run", icon=":material/rocket_launch:")
