"""Launch page: a form for one RunConfig, validated before anything is submitted.

"Launch" submits one run; "Launch DP and DDP with this config" submits the same config twice
(mode dp and mode ddp, one group) so the Live page can put them side by side; "Launch single,
DP, DDP and FSDP" adds the one-device baseline and the sharded run (`workers.sweeps.submit_trio`)
for the Compare page.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from app import form
from app.connection import get_client
from app.widgets import field_widget, show_errors
from engine.config import ConfigError
from workers.sweeps import submit_trio

LIVE_PAGE = "views/live.py"
COMPARE_PAGE = "views/compare.py"


def config_form() -> tuple[dict[str, Any], str, str | None]:
    """Draw the form; returns (field values, label, which button was pressed or None)."""
    defaults, values = form.defaults(), {}
    with st.form("launch"):
        for col, (title, fields) in zip(st.columns(len(form.COLUMNS)), form.COLUMNS):
            with col:
                st.markdown(f"**{title}**")
                for f in fields:
                    values[f] = field_widget(f, defaults[f])
        for title, fields in (("Advanced", form.ADVANCED), ("Fault injection", form.FAULTS)):
            with st.expander(title):
                cols = st.columns(2)
                for i, f in enumerate(fields):
                    with cols[i % 2]:
                        values[f] = field_widget(f, defaults[f])
        label = st.text_input("label (optional)", key="cfg_label",
                              help="name shown in legends; default '<mode> ×<world_size> · <id>'. "
                                   "With the pair or trio buttons each run is named 'label · DP' etc.")
        left, middle, right = st.columns(3)
        one = left.form_submit_button("Launch", type="primary", key="launch_one",
                                      width="stretch")
        pair = middle.form_submit_button("Launch DP and DDP with this config", key="launch_pair",
                                         width="stretch")
        trio = right.form_submit_button("Launch single, DP, DDP and FSDP (to compare)",
                                        key="launch_trio", width="stretch")
    action = "one" if one else "pair" if pair else "trio" if trio else None
    return values, label.strip(), action


def submit(client, values: dict[str, Any], label: str, action: str) -> list[str] | None:
    """Validate, then submit one run, a DP/DDP pair or the single/DP/DDP/FSDP set; returns the run ids
    (None if refused).

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
            return list(client.submit_pair(config, label=label or None))
        if action == "trio":
            group, ids = submit_trio(client, config, label=label or None)
            st.session_state["focus_group"] = group
            return list(ids.values())
        return [client.submit(config, label=label or None)]
    except ConfigError as exc:  # the worker side knows more (e.g. installed model plugins)
        show_errors(exc.errors)
    except Exception as exc:  # Redis went away between ping and submit
        st.error(f"Submitting failed: {type(exc).__name__}: {exc}")
    return None


def launched_panel() -> None:
    """After a launch: the ids and a way to the Live page."""
    ids = st.session_state.get("launched")
    if not ids:
        return
    st.success(f"Launched {len(ids)} run(s): " + ", ".join(f"`{i}`" for i in ids),
               icon=":material/rocket_launch:")
    live = ids[-2:]  # Live shows two runs: of a compare set, DDP and FSDP
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
client = get_client()  # None after a banner when Redis is down; the form still validates
values, label, action = config_form()
if action:
    ids = submit(client, values, label, action)
    if ids:
        st.session_state["launched"] = ids
        st.session_state["live_runs"] = ids[-2:]
launched_panel()
