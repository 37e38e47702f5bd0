"""Finding and stopping every process that belongs to one run, wherever it was reparented.

The job marks its process with ``DDPVIZ_RUN_ID=<run_id>`` in the environment before it starts the
engine; every process the engine starts (DDP rank processes, data loaders) inherits it. When a
work-horse is killed, its children may survive in another process group or session (torch
elastic's subprocess launcher uses ``start_new_session``), so the worker sweeps by that mark.
Linux and macOS (psutil reads other processes' environments of the same user).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable

RUN_ENV_VAR = "DDPVIZ_RUN_ID"  # set in the job's environment; inherited by the run's processes
REAP_GRACE_S = 2.0  # between SIGTERM and SIGKILL


def processes_with_env(var: str, value: str) -> list:
    """psutil.Process objects of this user whose environment has ``var=value`` (never this
    process or its ancestors)."""
    import psutil

    me = psutil.Process()
    spared = {me.pid, *(p.pid for p in me.parents())}
    uid = os.getuid()
    found = []
    for proc in psutil.process_iter(["pid", "uids"]):
        try:
            if proc.pid in spared or proc.info["uids"] is None or proc.info["uids"].real != uid:
                continue
            if proc.environ().get(var) == value:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def terminate(procs: Iterable, grace_s: float = REAP_GRACE_S) -> list[int]:
    """SIGTERM `procs`, then SIGKILL those still alive after `grace_s` seconds.

    Returns:
        pids that were signalled.
    """
    import psutil

    procs = list(procs)
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    return [p.pid for p in procs]


def kill_run_processes(run_id: str, grace_s: float = REAP_GRACE_S,
                       spare_children_of: int | None = None) -> list[int]:
    """Stop every process marked with `run_id` (see module docstring). Returns their pids.

    Args:
        spare_children_of: leave this pid's direct children alone: the run's own work-horse
            calls it at the end of a run, and its children end with it (rank processes carry a
            parent-death signal; multiprocessing's resource tracker, which ignores SIGTERM, exits
            when its parent does, after unlinking what dead ranks left behind).
    """
    procs = processes_with_env(RUN_ENV_VAR, run_id)
    if spare_children_of is not None:
        procs = [p for p in procs if _ppid(p) != spare_children_of]
    return terminate(procs, grace_s)


def _ppid(proc) -> int | None:
    try:
        return proc.ppid()
    except Exception:
        return None
