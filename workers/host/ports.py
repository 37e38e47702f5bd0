"""Who holds a TCP port on this host, so `ddpviz up` can say more than "the port is taken".

A port is taken when binding it fails with EADDRINUSE (`port_in_use`). The process listening on it
is found through psutil's connection table (`listener`; Linux reads /proc, and sees the pids of this
user's processes). A listener that is a ddpviz app (a ``streamlit`` command line running ddpviz's
app, or carrying an `up` token: a checkout's ``app/main.py`` has no "ddpviz" in its path) is named
with how to stop it: its `ddpviz up` when that still runs, else the app and every
process that carries the same `up` token (``DDPVIZ_UP_TOKEN``: the workers that `up` left behind).
"""

from __future__ import annotations

import errno
import socket

from ddpviz.workers.host.procs import UP_TOKEN_ENV
from ddpviz.workers.host.reaper import processes_with_env

CMDLINE_SHOWN_CHARS = 120  # of a foreign listener's command line, in the message


def port_in_use(host: str, port: int) -> bool:
    """True when TCP `port` on `host` cannot be bound because something holds it (False when it can,
    or when the address itself does not resolve or bind: the app then says why itself)."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, OSError):
        return False
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Tornado does: TIME_WAIT is no holder
        try:
            sock.bind(addr)
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def listener(port: int):
    """The psutil.Process listening on TCP `port` (any address), or None where none is seen."""
    import psutil

    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):  # e.g. macOS without root
        return None
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            try:
                return psutil.Process(c.pid)
            except psutil.Error:
                return None
    return None


def _is_up(proc) -> bool:
    """Whether `proc` is a `ddpviz up` (``ddpviz up ...`` or ``python -m ddpviz.workers up ...``)."""
    import psutil

    try:
        argv = proc.cmdline()
    except psutil.Error:
        return False
    return "up" in argv[1:] and any("ddpviz" in a for a in argv[:argv.index("up", 1)])


def describe_holder(port: int) -> str | None:
    """A sentence naming what listens on `port` and, for a ddpviz app, how to stop it; None when
    nothing listening there can be seen."""
    import psutil

    proc = listener(port)
    if proc is None:
        return None
    try:
        line = " ".join(proc.cmdline())
        token = proc.environ().get(UP_TOKEN_ENV)
        parent = proc.parent()
    except psutil.Error:
        return f"pid {proc.pid} listens on it"
    if "streamlit" not in line or ("ddpviz" not in line and token is None):  # a checkout's app/main.py: the token
        return f"pid {proc.pid} listens on it ({line[:CMDLINE_SHOWN_CHARS]})"
    if parent is not None and _is_up(parent):
        return (f"a ddpviz app (pid {proc.pid}) of a running `ddpviz up` (pid {parent.pid}) listens on it: stop "
                f"that one (Ctrl-C in its terminal, or `kill {parent.pid}`)")
    pids = sorted({proc.pid, *(p.pid for p in (processes_with_env(UP_TOKEN_ENV, token) if token else []))})
    return (f"a ddpviz app (pid {proc.pid}) left running by a `ddpviz up` that is gone listens on it: stop it "
            f"and what that `up` left with `kill {' '.join(map(str, pids))}`")
