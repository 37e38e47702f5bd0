"""A process that must not outlive its parent: one home for Linux's parent-death signal.

Used by the rank fork server (`engine.modes.fork_server`), every rank (`engine.modes.ranks`),
the worker's work-horse (`workers.worker`) and the command `ddpviz run` starts (`workers.cli.attach`). Imports nothing but the standard library, so the fork
server can arm it before it spends seconds importing torch.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1  # prctl(2)
PARENT_ENV = "DDPVIZ_FORK_SERVER_PARENT"  # the pid the fork server must die with (set by its launcher)


def die_with_parent(parent_pid: int | None = None, sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send `sig` (SIGKILL by default) to this process when its parent dies (prctl(2)
    PR_SET_PDEATHSIG). `ddpviz run` arms SIGTERM in the command it starts: torchrun passes SIGTERM
    on to its workers and exits, where SIGKILL would leave them running.

    The signal is armed only from the call on: a parent that died before it is not seen, so with
    `parent_pid` given the process exits at once (status 1) when its parent is no longer that pid
    (it was re-parented to init or a subreaper). Linux only; elsewhere a no-op. Never raises.
    """
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig))
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def is_live_child(pid: int) -> bool:
    """`pid` is a live (not zombie) child of this process, by /proc/<pid>/stat (Linux; False elsewhere): a pid
    kept from earlier may since belong to anyone once its process was reaped."""
    from pathlib import Path

    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] != "Z" and int(fields[1]) == os.getpid()
