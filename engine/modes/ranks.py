"""What every rank process of a multi-process mode (DDP, FSDP) does around its training.

`engine.modes.launcher` starts one process per rank with torch.distributed's elastic launch and
hands each the same arguments; `run_rank` is the one bootstrap both modes share:

- asks Linux to kill the rank when its launcher dies (prctl PR_SET_PDEATHSIG);
- writes, in the launcher's workdir, by local rank L: `local<L>.json` ({rank, pid, host}) at start,
  `local<L>.jsonl` events (batched; the launcher forwards them), and on failure
  `local<L>.error.json` ({rank, step, host, exception, traceback}), written to a temporary name
  and renamed into place, so the launcher, which polls for it, never reads it half-written;
  `local<L>.lost.json` when events were lost and the event file could not say so (`write_lost`);
- closes the event sink and leaves the process group however the training ends
  (`leave_process_group`: the order of teardown that cannot deadlock a gloo rank at its end).

`init_rank` is the shared start of the training itself: the device of this local rank, CPU threads
per rank, `init_process_group` with the run's collective timeout.

Rank processes start from a fork server (`START_METHOD`) that has imported torch, torch._dynamo
(which DDP's constructor imports) and the rank code once (`prepare_fork_server`): each rank then
starts in ~0.1 s instead of re-importing ~3 s of modules, as a spawned interpreter must. The fork
server never touches CUDA, so forking from it is safe for CUDA ranks (PyTorch's multiprocessing
notes). It holds the environment it was started with, so every rank first takes on its launcher's
environment (`run_rank`'s `env`: CUDA_VISIBLE_DEVICES of a lease, the run's id, turn gates).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import sys
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

# Imported before any process group exists, on purpose. `DistributedDataParallel.__init__` imports
# torch._dynamo lazily, which imports torch.distributed.nn.functional, whose functions take
# `group=group.WORLD` as a default argument: imported after `init_process_group`, those defaults
# capture the live WORLD group, `destroy_process_group()` cannot free it (gloo's `shutdown()` is a
# no-op), and the gloo worker threads and the TCPStore outlive it into interpreter shutdown, where
# their unjoined std::threads abort the process ("terminate called without an active exception",
# SIGABRT) while the other ranks still finalize. tests/engine/test_rank_teardown.py checks it.
import torch.distributed.nn.functional  # noqa: F401,E402  (isort: keep after torch.distributed)

from ddpviz.engine.components.lifetime import PARENT_ENV, die_with_parent
from ddpviz.engine.components.training import cpu_threads_per_rank
from ddpviz.engine.config import RunConfig
from ddpviz.engine.events import EventSink
from ddpviz.engine.batching import rank_sink

START_METHOD = "forkserver"  # how the launcher starts rank processes (see the module docstring)
# imported once by the fork server, before it forks any rank (names that fail to import are skipped)
FORK_SERVER_PRELOAD = ("ddpviz.engine.modes.fork_server", "torch", "torch.distributed", "torch._dynamo",
                       "torch.distributed.fsdp", "ddpviz.engine.modes.ranks", "ddpviz.engine.modes.ddp.rank",
                       "ddpviz.engine.modes.fsdp.rank", "ddpviz.engine.data")
progress: dict[str, int | None] = {"step": None}  # the step this rank is in, for its error report


@dataclass(frozen=True)
class RankEnv:
    """This rank's place in the run, from the variables torch's elastic agent sets."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def device_name(self) -> str:
        """The name events carry: ``cuda:<local_rank>`` on GPUs, ``cpu:<rank>`` on CPU."""
        return f"cuda:{self.local_rank}" if self.device.type == "cuda" else f"cpu:{self.rank}"


def rank_device(device_kind: str, local_rank: int) -> torch.device:
    """``cuda:<local_rank>`` (made current) when `device_kind` is "cuda", else the CPU."""
    if device_kind == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device(f"cuda:{local_rank}")
    return torch.device("cpu")


def init_rank(cfg: RunConfig, backend: str, device_kind: str) -> RankEnv:
    """Join the run's process group (a collective: every rank must call it).

    Reads RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT from the environment; on CPU, sets this
    process's intra-op threads to its share of the cores (`cpu_threads_per_rank`).
    """
    local_rank, world = int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    device = rank_device(device_kind, local_rank)
    if device.type == "cpu":
        torch.set_num_threads(cpu_threads_per_rank(world))
    join_process_group(backend, timeout=timedelta(seconds=cfg.collective_timeout_s))
    return RankEnv(int(os.environ["RANK"]), local_rank, world, device)


def join_process_group(backend: str, **kwargs) -> None:
    """`torch.distributed.init_process_group(backend, **kwargs)`: the engine's one call of it, so
    every process group is created after this module's import of torch.distributed.nn.functional
    (see the comment there) and `destroy_process_group()` really frees it."""
    dist.init_process_group(backend, **kwargs)


def leave_process_group() -> None:
    """`torch.distributed.destroy_process_group()`, in the one order that cannot deadlock: the
    engine's one call of it (and the tests' references'). No-op when no group is up.

    The deadlock it avoids (seen as a rank hung at its end, 1 in ~40 two-rank runs on this 2-core
    machine; gdb showed both threads): `ProcessGroupGloo`'s destructor joins its worker threads
    (`pt_gloo_runloop`). A worker may still be releasing the last collective's work, whose tensors
    have Python objects: freeing one takes the GIL (`TensorImpl::decref_pyobject`). The Python
    handle of a process group releases the GIL before destroying it (pytorch/pytorch#154976), but a
    `DistributedDataParallel`'s C++ `Reducer` (and its `Logger`) hold the group too and are freed
    holding the GIL: when `destroy_process_group()` runs while a DDP is alive, the reducer's
    release is the last, later, and the join waits on a worker that waits on the GIL.

    So: drop the logger, reducer and group handle of every DDP still alive on the
    default group (its training is over: the group goes; its module and parameters stay), then
    destroy the group while only `torch.distributed`'s own handles hold it: the group and its
    threads are gone on return. tests/engine/test_rank_teardown.py checks that with a DDP alive.
    Not for attached scripts: their objects are theirs.
    """
    import gc

    from torch.nn.parallel import DistributedDataParallel

    if not dist.is_initialized():
        return
    world = dist.group.WORLD
    # the DDPs holding the group: found from the group's referrers (a DDP, or its __dict__) rather
    # than gc.get_objects(), whose list touches every object (in a rank forked from the fork
    # server: ~19,000 copied pages, 160 ms; get_referrers reads only, ~45 ms a pass)
    holders = gc.get_referrers(world)
    dicts = [h for h in holders if isinstance(h, dict) and h.get("process_group") is world]
    owners = holders + (gc.get_referrers(*dicts) if dicts else [])
    for obj in owners:
        # issubclass of the type: isinstance() on a dead weakref.proxy raises ReferenceError
        if issubclass(type(obj), DistributedDataParallel) and obj.__dict__.get("process_group") is world:
            for holder in ("logger", "reducer", "process_group"):  # logger → reducer → group
                obj.__dict__.pop(holder, None)
    dist.destroy_process_group()


def prepare_fork_server() -> str:
    """Name the modules the fork server imports before its first fork; returns `START_METHOD`.

    Call it before the first rank of this process starts (later calls change nothing: the server,
    once running, keeps its imports).
    """
    os.environ[PARENT_ENV] = str(os.getpid())  # read by engine.modes.fork_server as it starts
    multiprocessing.set_forkserver_preload(list(FORK_SERVER_PRELOAD))
    return START_METHOD


def start_rank_processes(fn: Callable, args: tuple, nprocs: int, *, join: bool = True):
    """`torch.multiprocessing.start_processes(fn, args, nprocs)` from the fork server, each process
    first taking on this process's environment (as `run_rank` does for the launcher's ranks).

    `fn(i, *args)` must be a module-level function. Returns the `ProcessContext` (join=False) or
    None; raises as `start_processes` does when a process fails (join=True).
    """
    import torch.multiprocessing as mp

    return mp.start_processes(_with_env, args=(fn, dict(os.environ), *args), nprocs=nprocs, join=join,
                              start_method=prepare_fork_server())


def _with_env(i: int, fn: Callable, env: dict[str, str], *args) -> None:
    os.environ.clear()
    os.environ.update(env)
    fn(i, *args)


TrainRank = Callable[[RunConfig, str, int, Path, str, str, EventSink, str], None]


PROFILE_ENV = "DDPVIZ_PROFILE_RANK"  # a folder: each rank's cProfile stats (rank<R>.pstats), a diagnostic


def _profiler(folder: str | None, rank: int):
    """When `folder` is set (`PROFILE_ENV`: where ddpviz's own Python time goes in a rank, e.g. on a GPU
    host; it slows the rank), a running `cProfile.Profile` and the function that stops it and writes
    `folder/rank<rank>.pstats`; else None. Neither raises: a folder it cannot write is said on stderr."""
    if not folder:
        return None
    import cProfile

    path = Path(folder).resolve() / f"rank{rank}.pstats"
    profile = cProfile.Profile()
    profile.enable()

    def stop() -> None:
        profile.disable()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            profile.dump_stats(path)
        except OSError as exc:
            print(f"ddpviz: {PROFILE_ENV}: could not write {path}: {exc}", file=sys.stderr)
    return stop


def run_rank(train: TrainRank, cfg_dict: dict, run_id: str, workdir: str, backend: str,
             device_kind: str, host: str = "", env: dict[str, str] | None = None) -> None:
    """Run `train(cfg, run_id, rank, workdir, backend, device_kind, sink, host)` as one rank.

    `host` labels this rank's events (the worker's identity, which tells hosts apart). `env` is
    the launcher's environment: it replaces the fork server's before anything else runs (the
    elastic agent's own variables, RANK and the rest, are kept). Any exception is written to
    `local<L>.error.json` (atomically) and raised again, so the elastic agent sees the rank fail.
    """
    if env is not None:
        merged = rank_environ(dict(os.environ), env)
        os.environ.clear()
        os.environ.update(merged)
    die_with_parent()
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    wd = Path(workdir)
    (wd / f"local{local}.json").write_text(json.dumps(dict(rank=rank, pid=os.getpid(), host=host)))
    sink = rank_sink(wd / f"local{local}.jsonl")
    profile = _profiler(os.environ.get(PROFILE_ENV), rank)
    try:
        train(RunConfig(**cfg_dict), run_id, rank, wd, backend, device_kind, sink, host)
    except BaseException as exc:
        write_error(wd, local, dict(rank=rank, step=progress["step"], host=host,
                                    exception=f"{type(exc).__name__}: {exc}",
                                    traceback="".join(traceback.format_exception(exc))))
        raise
    finally:
        if profile is not None:
            profile()  # a diagnostic: it never hides the rank's own error or skips the rest
        sink.close()
        if sink.unreported_lost:  # the event file failed to the end: say so beside it
            write_lost(wd, local, dict(rank=rank, events_lost=sink.unreported_lost,
                                       error=f"{type(sink.last_error).__name__}: {sink.last_error}"))
        with contextlib.suppress(Exception):
            leave_process_group()


_AGENT_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
               "ROLE_NAME", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _from_agent(name: str) -> bool:
    """A variable torch's elastic agent sets for each rank (torch/distributed/elastic/agent)."""
    return name in _AGENT_VARS or name.startswith("TORCHELASTIC_")


def rank_environ(forked: dict[str, str], launcher: dict[str, str]) -> dict[str, str]:
    """A rank's environment: the launcher's (`launcher`, the process that started the run now),
    with the elastic agent's per-rank variables taken from `forked` (the rank's environment as
    forked: the fork server's, frozen when it started, plus what the agent set for this rank).

    The agent's variables always win: a MASTER_PORT (or RANK...) left in the launcher's own
    environment, by a shell or an earlier in-process process group, must never point a rank at
    another run's store. NCCL_/TORCH_NCCL_ variables come from the launcher when it has them
    (the user's settings), else from the agent. Source: torch/distributed/elastic/agent/server/
    local_elastic_agent.py `_start_workers` (the variables set per worker).
    """
    agent = {k: v for k, v in forked.items() if _from_agent(k)}
    nccl = {k: v for k, v in forked.items() if k.startswith(("NCCL_", "TORCH_NCCL_")) and k not in launcher}
    base = {k: v for k, v in launcher.items() if not _from_agent(k)}
    return {**base, **nccl, **agent}


def write_lost(workdir: Path, local_rank: int, lost: dict) -> None:
    """`local<L>.lost.json` ({rank, events_lost, error}): events this rank could not write to its
    event file and could not report there either; the launcher turns it into a `log` event
    (`engine.modes.launcher`). Best effort: a disk that refuses this too leaves only the rank's
    stderr."""
    try:
        tmp = workdir / f"local{local_rank}.lost.json.tmp"
        tmp.write_text(json.dumps(lost))
        os.replace(tmp, workdir / f"local{local_rank}.lost.json")
    except OSError as exc:
        print(f"ddpviz rank {lost.get('rank')}: {lost.get('events_lost')} events lost ({exc})", flush=True)


def write_error(workdir: Path, local_rank: int, error: dict) -> None:
    """`local<L>.error.json`, renamed into place: the launcher never reads it half-written."""
    tmp = workdir / f"local{local_rank}.error.json.tmp"
    tmp.write_text(json.dumps(error))
    os.replace(tmp, workdir / f"local{local_rank}.error.json")
