"""Redis outages while a page is open: a banner instead of a traceback or a frozen chart.

A live panel runs inside `st.fragment(run_every=...)`; if Redis goes away between two ticks, its
next read raises. `guarded` turns that into one `st.warning` ("Redis at <url> is unreachable —
retrying") and lets the fragment's timer try again, so the panel recovers by itself when the
server is back. `retry_until_reachable` does the same for a page that could not start at all.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import redis
import streamlit as st

from ddpviz.workers.connection import RedisUnavailable, redact, redis_url

# What a lost server looks like from redis-py: refused/reset sockets, timeouts, our own wrapper.
REDIS_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, RedisUnavailable,
              ConnectionError, TimeoutError)
RETRY_S = 3.0  # how often a page without Redis checks whether it is back


def outage_message(url: str | None = None) -> str:
    """The banner's text, with any password in the URL masked."""
    return f"Redis at `{redact(url or redis_url())}` is unreachable — retrying"


def show_outage(url: str | None = None) -> None:
    st.warning(outage_message(url), icon=":material/cloud_off:")


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with Redis connection errors and timeouts shown as the outage banner.

    Other exceptions propagate (they are bugs, and Streamlit shows them)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except REDIS_DOWN:
            show_outage()
            return None

    return wrapper


def _answers(url: str) -> bool:
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=1.0, socket_timeout=1.0)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.RedisError, OSError, ValueError):
        return False


def retry_until_reachable() -> None:
    """A small fragment that pings Redis every `RETRY_S` seconds and reruns the whole page as soon
    as it answers, so a page opened during an outage comes back by itself."""

    def probe() -> None:
        if _answers(redis_url()):
            st.rerun(scope="app")
        st.caption(f"Checking again every {RETRY_S:g} s…")

    st.fragment(probe, run_every=RETRY_S)()
