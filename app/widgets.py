"""Form inputs shared by the pages that launch runs (Launch, Compare, Buckets, Sweeps), and `plain`, the escape
every page uses to show user text (a run's label) inside Markdown."""

from __future__ import annotations

import re
from typing import Any

import streamlit as st

from ddpviz.app import form

# The few fields a quick launch asks for; the rest keep RunConfig's defaults.
QUICK_FIELDS = ["world_size", "model", "dataset", "width", "depth", "global_batch_size", "steps",
                "bucket_cap_mb", "step_delay_s"]


# ASCII punctuation Markdown, Streamlit's directives (:red[..], :material/..:) and its LaTeX ($..$) act on; a
# backslash before any ASCII punctuation shows it as itself (CommonMark, "Backslash escapes")
_MARKDOWN_ACTIVE = re.compile(r"([\\`*_{}\[\]()#+\-.!|~<>$:&^])")


def plain(text: Any) -> str:
    """`text` escaped so that Markdown (st.markdown, captions, metric labels, alerts) shows it as typed: a run
    labelled ':red[ALERT] **bold** $x^2$ [link](http://example.com)' rendered red, bold, LaTeX and a live link in
    Live's headers (a new user, 2026-12-06). For text inside Markdown only; charts take labels as they are."""
    return _MARKDOWN_ACTIVE.sub(r"\\\1", str(text))


def field_widget(field: str, default: Any, prefix: str = "cfg") -> Any:
    """One input for `field`, keyed ``<prefix>_<field>``. Numbers have no bounds on purpose: the
    form must be able to hold a bad value so validation can name the field and the rule."""
    key, help_ = f"{prefix}_{field}", form.HELP.get(field)
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


def quick_fields(prefix: str, fields: list[str] | None = None, columns: int = 5,
                 overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """A compact grid of `fields` (default `QUICK_FIELDS`); returns the full config values
    (RunConfig defaults for everything not shown). Call inside an `st.form`."""
    values = {**form.defaults(), **(overrides or {})}
    cols = st.columns(columns)
    for i, f in enumerate(fields or QUICK_FIELDS):
        with cols[i % columns]:
            values[f] = field_widget(f, values[f], prefix)
    return values


def pick_step(steps: list[int], key: str, default: int | None = None,
              notes: dict[int, str] | None = None) -> int | None:
    """Buttons for `steps`; follows `default` (the newest step unless given) until the reader
    picks another one. `notes` adds a word to a step's button (e.g. "traced")."""
    if not steps:
        return None
    default = default if default in steps else steps[-1]
    latest_key = f"{key}_latest"
    current = st.session_state.get(key)
    if current not in steps or current == st.session_state.get(latest_key):
        st.session_state[key] = default  # at the default (or nothing picked): keep following it
    st.session_state[latest_key] = default
    notes = notes or {}
    label = "step (kept: 0 and 1, one every few across the run, the latest ones)"
    return st.segmented_control(label, steps, key=key,
                                format_func=lambda s: f"step {s}" + (f" ({notes[s]})" if s in notes else ""),
                                required=True)


def show_errors(errors: list[tuple[str, str]]) -> None:
    """One line per broken rule, naming the field."""
    lines = "\n".join(f"- **{field}**: {msg}" for field, msg in errors)
    st.error(f"Not launched: fix {len(errors)} field(s).\n\n{lines}", icon=":material/warning:")
