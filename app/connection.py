"""The app's one Redis client (`st.cache_resource`) and the banner shown when Redis is down."""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

import streamlit as st

DEFAULT_REDIS_URL = "redis://localhost:6379/0"


def redis_url() -> str:
    """The server the app talks to: `REDIS_URL`, else the local default."""
    return os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL


def redact_url(url: str) -> str:
    """`url` with any password replaced by ``***`` (``redis://:pw@h:1/0`` -> ``redis://:***@h:1/0``)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable REDIS_URL>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _scrub(text: str, url: str) -> str:
    """`text` with the URL's password (if any) masked, e.g. in an exception message."""
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    return text.replace(password, "***") if password else text


@st.cache_resource(show_spinner=False)
def _client(url: str):
    from workers.client import DdpvizClient

    return DdpvizClient(url=url)


def get_client():
    """The shared `DdpvizClient`, or None after showing an error banner when Redis is unreachable.

    Never raises: a missing server, a refused connection or a bad URL all become one `st.error`
    naming the URL (password hidden) and how to start a server.
    """
    url = redis_url()
    try:
        client = _client(url)
        if client.ping():
            return client
        reason = "it did not answer PING"
    except Exception as exc:  # any failure here is a connection problem for the user
        reason = _scrub(f"{type(exc).__name__}: {exc}", url)
    st.error(f"**Cannot reach Redis at `{redact_url(url)}`** ({reason}).  \n"
             "Start everything with `ddpviz up`, or point `REDIS_URL` at a running server "
             "and start a worker with `ddpviz worker`.", icon="🚫")
    return None


def require_client():
    """`get_client()`, stopping the page (after the banner) when there is none."""
    client = get_client()
    if client is None:
        st.stop()
    return client
