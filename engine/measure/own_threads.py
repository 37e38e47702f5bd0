"""ddpviz's own threads, seen from outside: their OS names and their CPU time.

Python names its threads for itself only; Linux shows every thread of a process as the process's
name (`top -H`, `ps -L`, py-spy, /proc). `name_this_thread` gives the calling thread its Python name as
its OS name (`prctl(PR_SET_NAME)`, 15 bytes), so the instrument's background threads — the event writer
(`engine.batching.BatchingSink`), the memory timer, the launcher's follower — show as `ddpviz-...` in a
user's own tools and in ours: `own_threads_cpu_ns` reads their on-CPU time from
`/proc/<pid>/task/<tid>/schedstat` (field 1, ns; Documentation/scheduler/sched-stats.rst), which the
bench uses for the instrument's background cost per step (`engine.harness.bucket_cost`).
Linux only; elsewhere, or on any failure, nothing is named and nothing read (fail open: these run
inside attached training).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading

PR_SET_NAME = 15  # prctl(2)
OS_NAME_PREFIX = "ddpviz-"  # the run's instrument threads (event writer, memory timer, follower) call name_this_thread


def name_this_thread() -> None:
    """Give the calling thread its Python name (first 15 bytes) as its OS name. Never raises."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(PR_SET_NAME, threading.current_thread().name.encode()[:15], 0, 0, 0)


def own_threads_cpu_ns(pid: int) -> dict[int, tuple[str, int]]:
    """{thread id: (OS name, on-CPU ns)} of process `pid`'s threads named `OS_NAME_PREFIX`...; {} where
    /proc cannot be read (the process gone, not Linux)."""
    out = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{pid}/task/{tid}/comm", encoding="utf-8", errors="replace") as fh:
                    name = fh.read().strip()
                if name.startswith(OS_NAME_PREFIX):
                    with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as fh:
                        out[int(tid)] = (name, int(fh.read().split()[0]))
    return out
