"""The app's one Redis client (`st.cache_resource`) and the banner shown when Redis is down."""

from __future__ import annotations

import streamlit as st

from ddpviz.app.outage import retry_until_reachable
from ddpviz.workers.connection import redact, redis_url


def redact_url(url: str) -> str:
    """`url` with any password replaced: ``redis://:pw@h:1/0`` -> ``redis://:***@h:1/0``."""
    return redact(url)


@st.cache_resource(show_spinner=False)
def _client(url: str):
    """One `DdpvizClient` per URL for the whole server. A failed connect raises, and
    `st.cache_resource` does not keep exceptions, so the next rerun tries again."""
    from ddpviz.workers.client import DdpvizClient
    from ddpviz.workers.connection import APP_SOCKET_TIMEOUT_S, connect

    return DdpvizClient(redis=connect(url, retry_attempts=1, socket_timeout_s=APP_SOCKET_TIMEOUT_S))


def _scrub(text: str, url: str) -> str:
    """`text` with the URL's password (if any) masked, e.g. in an exception message."""
    from urllib.parse import urlsplit

    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    return text.replace(password, "***") if password else text


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
        reason = _scrub(str(getattr(exc, "cause", None) or f"{type(exc).__name__}: {exc}"), url)
    st.error(f"**Cannot reach Redis at `{redact_url(url)}`** ({reason}).  \n"
             "Start everything with `ddpviz up`, or point `REDIS_URL` at a running server "
             "and start a worker with `ddpviz worker`.", icon=":material/cloud_off:")
    retry_until_reachable()
    return None


def require_client():
    """`get_client()`, stopping the page (after the banner) when there is none."""
    client = get_client()
    if client is None:
        st.stop()
    return client
