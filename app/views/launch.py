"""Launch page: a form for one RunConfig, validated before anything is submitted.

"Launch" submits one run; "Launch DP and DDP with this config" submits the same config twice
(mode dp and mode ddp, one group) so the Live page can put them side by side.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from app import form
from app.connection import get_client
from engine.config import ConfigError

LIVE_PAGE = "views/live.py"


def field_widget(field: str, default: Any) -> Any:
    """One input for `field`, keyed ``cfg_<field>``. Numbers have no bounds on purpose: the
    form must be able to hold a bad value so validation can name the field and the rule."""
    key, help_ = f"cfg_{field}", form.HELP.get(field)
    kind = form.kind(field)
    if kind == "choice":
        opts = form.choices(field)
        return st.selectbox(field, opts, index=opts.index(default) if default in opts else 0,
                            key=key, help=help_)
    if kind == "bool":
        return st.checkbox(field, value=bool(default), key=key, help=help_)
    if kind == "int":
        return st.number_input(field, value=int(default), step=1, key=key, help=help_)
    return st.number_input(field, value=float(default), step=None, format="%g", key=key,
                           help=help_)


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
                              help="name shown in legends; default '<mode> ×<world_size> · <id>'")
        left, right = st.columns(2)
        one = left.form_submit_button("Launch", type="primary", key="launch_one",
                                      width="stretch")
        pair = right.form_submit_button("Launch DP and DDP with this config", key="launch_pair",
                                        width="stretch")
    return values, label.strip(), "one" if one else "pair" if pair else None


def show_errors(errors: list[tuple[str, str]]) -> None:
    """One line per broken rule, naming the field."""
    lines = "\n".join(f"- **{field}**: {msg}" for field, msg in errors)
    st.error(f"Not launched: fix {len(errors)} field(s).\n\n{lines}", icon=":material/warning:")


def submit(client, values: dict[str, Any], label: str, action: str) -> list[str] | None:
    """Validate, then submit one run or a DP/DDP pair; returns the run ids (None if refused).

    Validation runs first, so a bad form never reaches Redis (nor needs it)."""
    config = form.pair_values(values) if action == "pair" else values
    errors = form.validation_errors(config)
    if errors:
        show_errors(errors)
        return None
    if client is None:
        st.warning("Valid, but not launched: no Redis (see above).")
        return None
    try:
        if action == "pair":
            return list(client.submit_pair(config))
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
    st.page_link(LIVE_PAGE, label="Watch them live", icon=":material/monitoring:",
                 query_params={"runs": ",".join(ids)})


st.title("Launch a run")
st.caption("Same model, same global batch: DataParallel (one process, threads, device 0 does the "
           "bookkeeping) vs DistributedDataParallel (one process per rank, bucketed all-reduce "
           "overlapping backward).")
client = get_client()  # None after a banner when Redis is down; the form still validates
values, label, action = config_form()
if action:
    ids = submit(client, values, label, action)
    if ids:
        st.session_state["launched"] = ids
        st.session_state["live_runs"] = ids
launched_panel()
