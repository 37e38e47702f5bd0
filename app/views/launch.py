"""Launch page: what to launch, a preset, then a form for one RunConfig, validated before anything
is submitted.

"What to launch" picks the form's one button: DP and DDP of the same config (one group, the
default: the Live page puts them side by side), single, DP, DDP and FSDP (`workers.sweeps.submit_trio`,
for the Compare page), or one run of the form's `mode`. The form shows only the fields the choice
uses (`app.form.IGNORED`). "Preset" refills the form from `engine.config.PRESETS`. After a launch a
banner names each run's id and mode, and a line under it says whether a worker took them or refused
one (`launch_status`); both are gone when the reader comes back from another page.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from ddpviz.app import form, runsets
from ddpviz.app.connection import get_client
from ddpviz.app.navigation import forget_on_arrival
from ddpviz.app.widgets import field_widget, show_errors
from ddpviz.app.window import TERMINAL
from ddpviz.engine.config import ConfigError
from ddpviz.workers.heartbeat import NO_WORKER
from ddpviz.workers.sweeps import MEMBER_NAMES, submit_trio

LIVE_PAGE = "views/live.py"
STATUS_REFRESH_S = 2.0  # how often the line under the banner reads the runs' records
COMPARE_PAGE = "views/compare.py"


def refill_form() -> None:
    """on_change of "Preset": every field back to the chosen preset's value (written to the
    widgets' session state, which a keyed widget's new default would not change)."""
    for field, value in form.defaults(st.session_state["launch_preset"]).items():
        st.session_state[f"cfg_{field}"] = value


def choose() -> tuple[str, str]:
    """The two choices above the form: (action, preset)."""
    # one under the other, each the page's width: a segmented control does not wrap, and in half
    # a 1024 px page its last segments were cut off
    action = st.segmented_control("What to launch", list(form.ACTIONS), default="pair",
                                  format_func=form.ACTIONS.get, required=True, key="launch_what",
                                  help=form.ACTIONS_HELP)
    preset = st.segmented_control("Preset", list(form.PRESET_NAMES), default="default",
                                  format_func=form.PRESET_NAMES.get, required=True,
                                  key="launch_preset", on_change=refill_form, help=form.PRESETS_HELP)
    if preset == "tiny":
        st.caption("Tiny is the former default (mlp 128×3, global batch 64, 25 MiB buckets): fast, "
                   "but its gradients fit one bucket, so DDP has nothing to overlap with backward.")
    return action, preset


def config_form(action: str, preset: str) -> tuple[dict[str, Any], str, bool]:
    """Draw the form for `action` ("pair", "trio" or "one") with `preset`'s defaults; returns
    (every field's value, those not shown at their defaults; the label; whether the button was
    pressed)."""
    defaults = form.defaults(preset)
    values = dict(defaults)  # the fields the action ignores keep their defaults
    with st.form("launch"):
        for col, (title, fields) in zip(st.columns(len(form.COLUMNS)), form.COLUMNS):
            with col:
                st.markdown(f"**{title}**")
                for f in form.shown(fields, action):
                    values[f] = field_widget(f, defaults[f])
        for title, fields in (("Advanced", form.ADVANCED), ("Fault injection", form.FAULTS)):
            with st.expander(title):
                cols = st.columns(2)
                for i, f in enumerate(form.shown(fields, action)):
                    with cols[i % 2]:
                        values[f] = field_widget(f, defaults[f])
        label = st.text_input("label (optional)", key="cfg_label",
                              help="name shown in legends; default '<mode> ×<world_size> · <id>'. "
                                   "Of a pair or set each run is named 'label · DP' etc.")
        go = st.form_submit_button(form.SUBMIT_TEXT[action], type="primary", key=f"launch_{action}")
    return values, label.strip(), go


def submit(client, values: dict[str, Any], label: str, action: str) -> dict[str, str] | None:
    """Validate, then submit one run, a DP/DDP pair or the single/DP/DDP/FSDP set; returns
    {run_id: mode} in launch order (None if refused).

    Validation runs first, so a bad form never reaches Redis (nor needs it)."""
    config = form.pair_values(values) if action == "pair" else form.set_values(values) \
        if action == "trio" else values
    errors = form.validation_errors(config)
    if errors:
        show_errors(errors)
        return None
    if client is None:
        st.warning("Valid, but not launched: no Redis (see above).")
        return None
    try:
        if action == "pair":  # a label names the set: "X · DP", "X · DDP"
            ids = client.submit_pair(config, label=label or None)
            st.session_state["focus_group"] = (client.get_run(ids[0]) or {}).get("group")  # as the set's
            return dict(zip(ids, ("dp", "ddp")))
        if action == "trio":
            group, ids = submit_trio(client, config, label=label or None)
            st.session_state["focus_group"] = group
            return {run_id: mode for mode, run_id in ids.items()}
        return {client.submit(config, label=label or None): config["mode"]}
    except ConfigError as exc:  # the worker side knows more (e.g. installed model plugins)
        show_errors(exc.errors)
    except Exception as exc:  # Redis went away between ping and submit
        st.error(f"Submitting failed: {type(exc).__name__}: {exc}")
    return None


def _named(run_id: str, mode: str) -> str:
    return f"`{run_id}` {MEMBER_NAMES.get(mode, mode)}"


def launched_text(launched: dict[str, str]) -> str:
    """The banner's line: each run id with its mode, e.g. "Submitted 2 runs: `ab12` DP, `cd34` DDP".
    Submitted, not launched: a worker's pre-flight checks may still refuse a run (`launch_status`)."""
    runs = ", ".join(_named(run_id, mode) for run_id, mode in launched.items())
    return f"Submitted {len(launched)} run{'s' if len(launched) > 1 else ''}: {runs}"


ENDED_BADLY = ("failed", "canceled", "lost")


def launch_status(launched: dict[str, str], records: dict[str, dict[str, Any] | None],
                  workers_alive: int | None = None) -> tuple[str, str]:
    """(kind, text) of the line under the banner, from the runs' records (`DdpvizClient.get_run`):
    "error" naming each run that failed, was canceled or lost, with its record's reason (a pre-flight
    refusal comes back this way: PowerSGD on gloo with several buckets, a pair whose DDP run was
    refused); else "info" while any waits for a worker or is in its pre-flight checks (started, its
    record without the `run_started` event the engine sends once they passed); else "success": that every
    run finished where each succeeded, else that they passed their checks. Kind
    is a Streamlit call's name (`st.error`, `st.info`, `st.success`). With `workers_alive` 0, runs waiting for a
    worker are a "warning" that none is alive (`workers.heartbeat.NO_WORKER`)."""
    recs = {run_id: records.get(run_id) or {} for run_id in launched}  # a run not found yet: no record
    ended = []
    for run_id, mode in launched.items():
        rec = recs[run_id]
        if rec.get("status") in ENDED_BADLY:
            lines = str((rec.get("error") or {}).get("exception") or "").strip().splitlines()
            ended.append((run_id, mode, rec["status"], lines[0] if lines else "no reason recorded"))
    bad = []
    for run_id, mode, status, reason in ended:  # a pair's DP quotes its DDP's refusal: said once
        for other_id, other_mode, _, other in ended:
            if other_id != run_id and len(other) > 20 and other in reason:
                reason = reason.replace(other, f"{MEMBER_NAMES.get(other_mode, other_mode)}'s reason")
        bad.append(f"{_named(run_id, mode)} {status}: {reason}")
    if bad:
        return "error", "Not trained as asked. " + " · ".join(bad) + " (the Runs page keeps the whole error)."
    waiting = [_named(r, m) for r, m in launched.items() if recs[r].get("status", "queued") == "queued"]
    if waiting and workers_alive == 0:
        return "warning", f"Waiting for a worker: {', '.join(waiting)}. But {NO_WORKER}."
    if waiting:
        return "info", ("Waiting for a worker: " + ", ".join(waiting)
                        + ". A worker checks each run before it trains; a refusal shows here.")
    # a run's record keeps its `run_started` event, which the engine sends once the pre-flight checks passed
    checking = [_named(r, m) for r, m in launched.items()
                if recs[r].get("status") == "started" and not recs[r].get("started")]
    if checking:
        return "info", "A worker took them; pre-flight checks under way for " + ", ".join(checking) + "."
    if all(recs[r].get("status") == "succeeded" for r in launched):
        one = len(launched) == 1
        return "success", ("Finished: " + ", ".join(_named(r, m) for r, m in launched.items())
                           + (" succeeded. Live shows it" if one else " all succeeded. Live and Compare show them")
                           + "; the Runs page keeps " + ("it." if one else "them."))
    return "success", "Every run passed its pre-flight checks and is training or done: Live shows its steps."


def settled(records: dict[str, dict[str, Any]]) -> bool:
    """Whether every run's record is in a final state (`app.window.TERMINAL`: succeeded, failed,
    canceled, lost): its status line can no longer change."""
    return bool(records) and all((r or {}).get("status") in TERMINAL for r in records.values())


def status_line(launched: dict[str, str]) -> None:
    """`launch_status`, read again every `STATUS_REFRESH_S` while a run may still change; once every run
    is settled the fragment stops polling (the page reruns once, as `app.runsets.live_body` does)."""
    client = get_client()
    if client is None:
        return
    flag = "launch_status_polling"

    def tick() -> None:
        try:
            records = {run_id: client.get_run(run_id) for run_id in launched}
            alive = len(client.workers())
        except Exception as exc:  # Redis went away: the banner above still names the runs
            st.warning(f"Could not read the runs' status: {type(exc).__name__}: {exc}")
            return
        kind, text = launch_status(launched, records, alive)
        getattr(st, kind)(text)
        if st.session_state.get(flag) and settled(records):
            st.session_state[flag] = False
            st.rerun()

    try:
        polling = not settled({run_id: client.get_run(run_id) for run_id in launched})
    except Exception:  # Redis went away: keep polling, the fragment says so and retries
        polling = True
    st.session_state[flag] = polling
    st.fragment(tick, run_every=STATUS_REFRESH_S if polling else None)()


def launched_panel() -> None:
    """After a launch (this visit of the page): which run is which, whether a worker took them
    (`status_line`), and the ways to Live and Compare."""
    launched = st.session_state.get("launched")
    if not launched:
        return
    ids = list(launched)
    st.info(launched_text(launched), icon=":material/rocket_launch:")
    status_line(launched)
    # Live shows two runs: of a set, DP and DDP, the pair its verdict compares
    live = runsets.pair_first(launched)
    st.page_link(LIVE_PAGE, label="Watch them live", icon=":material/monitoring:",
                 query_params={"runs": ",".join(live)})
    if len(ids) > 1:
        st.page_link(COMPARE_PAGE, label="Compare them", icon=":material/compare_arrows:",
                     query_params={"runs": ",".join(ids)})


st.title("Launch a run")
st.caption("Same model, same global batch: DataParallel (one process, threads, device 0 does the "
           "bookkeeping) vs DistributedDataParallel (one process per rank, bucketed all-reduce "
           "overlapping backward) vs fully sharded data parallel (FSDP2: each rank holds 1/n of the "
           "model and gathers each block when it needs it).")
forget_on_arrival(st.session_state, ("launched",))  # the banner belongs to the visit that launched
client = get_client()  # None after a banner when Redis is down; the form still validates
action, preset = choose()
values, label, go = config_form(action, preset)
if go:
    launched = submit(client, values, label, action)
    if launched:
        st.session_state["launched"] = launched  # {run_id: mode}
        st.session_state["live_runs"] = list(launched)[-2:]
launched_panel()
