"""Which page the previous script run drew, so a page can tell a rerun of itself (a widget changed,
a button was pressed) from an arrival (the reader came from another page, or opened the app).

`app/main.py` calls `note_page` once per full script run, before the page runs; fragment reruns
(`st.fragment(run_every=…)`) do not run `main.py` and so do not count as page changes. Pure
functions of a mutable mapping (`st.session_state` in the app, a dict in tests).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

PAGE_NOW, PAGE_BEFORE = "nav_page_now", "nav_page_before"  # session-state keys


def note_page(state: MutableMapping[str, Any], page: str) -> None:
    """Record `page` (a page's url path, or any id unique to it) as the page this run draws,
    keeping the page the previous run drew under `PAGE_BEFORE`."""
    state[PAGE_BEFORE] = state.get(PAGE_NOW)
    state[PAGE_NOW] = page


def arrived(state: MutableMapping[str, Any]) -> bool:
    """True when this run draws another page than the previous run did (or is the first run)."""
    return state.get(PAGE_BEFORE) != state.get(PAGE_NOW)


def forget_on_arrival(state: MutableMapping[str, Any], keys: tuple[str, ...]) -> None:
    """Drop `keys` from `state` when the reader has just arrived on this page: what the page
    showed after an action (e.g. the Launch page's banner) belongs to that visit only."""
    if arrived(state):
        for key in keys:
            state.pop(key, None)
