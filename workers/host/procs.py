"""Child processes that can be stopped completely: each in its own session and process group.

`ddpviz up` starts Redis, workers and the app this way, so a Ctrl-C in the terminal reaches only
`up`, which then stops the children in order. Every child carries ``DDPVIZ_UP_TOKEN`` in its
environment, inherited by grandchildren (work-horses, rank processes, whatever re-parents
itself), so a final sweep finds stragglers that left the process group.

A `Child` started with ``die_with_parent`` also gets SIGTERM from the kernel when the process that
started it dies, even by SIGKILL (Linux's ``prctl(PR_SET_PDEATHSIG)``; elsewhere nothing), so a
killed `up` leaves no app or worker behind holding its port.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from ddpviz.workers.host.reaper import processes_with_env, terminate

UP_TOKEN_ENV = "DDPVIZ_UP_TOKEN"
STOP_GRACE_S = 5.0  # after SIGTERM, before SIGKILL
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def parent_death_signal(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `subprocess.Popen` ``preexec_fn`` that has the kernel send `sig` to the child when its parent
    dies (``prctl(PR_SET_PDEATHSIG)``, prctl(2)); None off Linux, or where libc's prctl is not found.

    The parent is the *thread* that forks the child: call this and start the child from a thread that
    lives as long as the process (the main thread). The parent's pid is taken now, before the fork:
    one that died between the fork and the prctl would never signal the child, so the child then
    checks its parent is still that pid and exits if not (the race prctl(2) warns of).
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # loaded here: the child only calls it
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def set_in_child() -> None:
        prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(int(sig)), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
        if os.getppid() != parent:  # the parent died before the prctl took effect
            os._exit(128 + int(sig))

    return set_in_child


class Child:
    """One child process in a new session (so its process group id is its pid).

    Args:
        name: shown in messages (``worker-1``, ``app``).
        argv: the command.
        env: its full environment.
        log_path: stdout and stderr go here when given (else inherited).
        die_with_parent: on Linux the child gets SIGTERM when the thread that starts it dies, even
            by SIGKILL (`parent_death_signal`); its own children are not affected.
    """

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], log_path: str | None = None,
                 die_with_parent: bool = False):
        self.name, self.argv, self.env = name, list(argv), env
        self.log_path = log_path
        self.die_with_parent = die_with_parent
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Child":
        out = open(self.log_path, "ab") if self.log_path else None
        try:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT if out else None, start_new_session=True,
                                         preexec_fn=parent_death_signal() if self.die_with_parent else None)
        finally:
            if out is not None:
                out.close()  # the child holds its own descriptor
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal_group(self, sig: int) -> None:
        """Send `sig` to the child's process group (ignored once it is gone)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def wait(self, timeout_s: float) -> bool:
        """True if the child exited within `timeout_s` seconds."""
        if self.proc is None:
            return True
        try:
            self.proc.wait(timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False

    def stop(self, grace_s: float = STOP_GRACE_S, signals: Sequence[int] = (signal.SIGTERM,)) -> None:
        """Send each of `signals` in turn, waiting up to `grace_s` seconds after each for the
        child to exit, then SIGKILL its process group."""
        for sig in signals:
            if not self.running():
                break
            self.signal_group(sig)
            self.wait(grace_s)
        self.signal_group(signal.SIGKILL)  # also takes down group members the leader left behind
        self.wait(grace_s)


def sweep(token: str, grace_s: float = 2.0) -> list[int]:
    """Terminate every process still carrying ``DDPVIZ_UP_TOKEN=token``. Returns their pids."""
    return terminate(processes_with_env(UP_TOKEN_ENV, token), grace_s)


def wait_any_exit(children: Sequence[Child], timeout_s: float) -> Child | None:
    """The first child found exited within `timeout_s` seconds, or None."""
    deadline = time.monotonic() + timeout_s
    while True:
        for child in children:
            if not child.running():
                return child
        if time.monotonic() >= deadline:
            return None
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
