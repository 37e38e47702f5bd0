"""How the tests' independent references (plain PyTorch code: plain_ddp, ddp_reference, the FSDP
references) start their processes: from ddpviz's rank fork server (`engine.modes.ranks`), which has
imported torch once, instead of `spawn` (a fresh interpreter importing torch per process: ~4 s of
CPU each on this 2-core machine). Only the start differs; what runs is the reference's own code.

A reference that hangs (a collective that never completes) must not hang the suite for gloo's
30-minute default: each process dumps every thread's stack to stderr and exits after `timeout_s`
(`faulthandler.dump_traceback_later`), so the test fails with the place it hung.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import queue as queue_mod
import time
from typing import Any, Callable

from engine.modes.ranks import start_rank_processes

TIMEOUT_S = 240.0


def _guarded(i: int, fn: Callable, timeout_s: float, *args) -> None:
    faulthandler.dump_traceback_later(timeout_s, exit=True)
    try:
        fn(i, *args)
    finally:
        faulthandler.cancel_dump_traceback_later()


def run_reference(fn: Callable, args: tuple, nprocs: int, results: int = 0,
                  timeout_s: float = TIMEOUT_S) -> list[Any]:
    """Run `fn(i, *args, q)` in `nprocs` processes (i = 0..nprocs-1; `fn` module-level) and return
    the first `results` items they put on `q`, read while they run (a report bigger than a pipe's
    64 KiB would otherwise block its writer until the join that waits for it).

    Raises what `torch.multiprocessing` raises when a process fails (its traceback in the message),
    or TimeoutError after `timeout_s` + 30 s.
    """
    q = multiprocessing.get_context("forkserver").Queue()
    ctx = start_rank_processes(_guarded, (fn, timeout_s, *args, q), nprocs, join=False)
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s + 30
    while True:
        while len(got) < results:
            try:
                got.append(q.get(timeout=0.2))
            except queue_mod.Empty:
                break
        if ctx.join(timeout=0.5):
            break
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            raise TimeoutError(f"reference {fn.__module__}.{fn.__name__} still running after {timeout_s + 30:.0f} s")
    while len(got) < results:
        got.append(q.get(timeout=10))
    return got
