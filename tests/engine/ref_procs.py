"""How the tests' independent references (plain PyTorch code: plain_ddp, ddp_reference, the FSDP
references) start their processes: from ddpviz's rank fork server (`engine.modes.ranks`), which has
imported torch once, instead of `spawn` (a fresh interpreter importing torch per process: ~4 s of
CPU each on this 2-core machine). Only the start differs; what runs is the reference's own code.

A reference that hangs (a collective that never completes) must not hang the suite for gloo's
30-minute default: each process dumps every thread's stack to stderr and exits after `timeout_s`
(`faulthandler.dump_traceback_later`), so the test fails with the place it hung.

A reference leaves its process group by returning: `_guarded` then calls the engine's
`leave_process_group` (a reference that destroyed the group itself with its DDP still alive hung 1
run in ~40 at its end: the deadlock that function's docstring describes).
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import queue as queue_mod
import time
from typing import Any, Callable

from ddpviz.engine.modes.ranks import leave_process_group, start_rank_processes

TIMEOUT_S = 240.0


def _guarded(i: int, fn: Callable, timeout_s: float, *args) -> None:
    faulthandler.dump_traceback_later(timeout_s, exit=True)
    try:
        fn(i, *args)
        leave_process_group()  # here, once fn's locals (its DDP) are gone: see its docstring
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


def join_gloo(rank: int, world: int, port: int, threads: int | None = None) -> None:
    """In a reference process: join a `world`-rank gloo group whose store rank 0 serves on
    127.0.0.1:`port` (given in the call, not in os.environ), optionally with `threads` intra-op threads."""
    import torch
    import torch.distributed as dist

    if threads is not None:
        torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


def gloo_model(rank: int, world: int, port: int, cfg_dict: dict):
    """`join_gloo` with one thread, then the config's dataset and a freshly built model (the
    plugin's `build_model`, seeded as ddpviz seeds it): returns (cfg, dataset, model)."""
    from ddpviz.engine.config import RunConfig
    from ddpviz.engine.data import load_dataset
    from ddpviz.engine.models import build_model

    join_gloo(rank, world, port, threads=1)
    cfg = RunConfig(**cfg_dict)
    ds = load_dataset(cfg)
    return cfg, ds, build_model(cfg, ds)
