"""Starts DDP rank processes with torch.distributed's elastic launch and follows them.

`launch_ddp` runs `torch.distributed.launcher.api.elastic_launch` (the engine behind `torchrun`:
c10d rendezvous, `spawn` start method, no restarts) in this thread, while a follower thread
forwards each rank's event file to the run's sink and watches `should_stop`. On cancel it kills
the rank processes (SIGKILL to each pid, then the elastic agent tears the group down) and the run
ends as canceled. A rank that fails makes the agent stop the others; the run's error is the
earliest error a rank wrote ({rank, exception, traceback}).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import threading
from pathlib import Path
from typing import Callable

import torch

from engine.config import RunConfig
from engine.devices import DevicePlan
from engine.events import JsonlTail
from engine.loop import Canceled

FOLLOW_INTERVAL_S = 0.1  # how often rank event files are read and should_stop is polled
RDZV_TIMEOUT_S = 60  # rendezvous must complete within this many seconds


class RankFailed(RuntimeError):
    """A rank process failed; `.error` is {rank, exception, traceback}."""

    def __init__(self, error: dict):
        self.error = error
        super().__init__(error.get("exception", "rank failed"))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on `host` (each job gets its own, so concurrent jobs never clash)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class _Follower(threading.Thread):
    """Forwards rank events to the sink and kills the ranks when `should_stop()` turns True."""

    def __init__(self, workdir: Path, world_size: int, out, should_stop):
        super().__init__(name="ddpviz-rank-follower", daemon=True)
        self.tails = [JsonlTail(workdir / f"rank{r}.jsonl") for r in range(world_size)]
        self.workdir, self.world_size, self.out, self.should_stop = workdir, world_size, out, should_stop
        self.done = threading.Event()
        self.canceled = False

    def pump(self) -> None:
        for t in self.tails:
            for e in t.read_new():
                self.out.emit(e)

    def kill_ranks(self) -> None:
        for r in range(self.world_size):
            with contextlib.suppress(Exception):
                os.kill(int((self.workdir / f"rank{r}.pid").read_text()), signal.SIGKILL)

    def run(self) -> None:
        while not self.done.wait(FOLLOW_INTERVAL_S):
            self.pump()
            if not self.canceled and self.should_stop is not None and self.should_stop():
                self.canceled = True
                self.kill_ranks()


def _first_error(workdir: Path, world_size: int) -> dict | None:
    errors = []
    for r in range(world_size):
        p = workdir / f"rank{r}.error.json"
        if p.exists():
            errors.append((p.stat().st_mtime, json.loads(p.read_text())))
    return min(errors, key=lambda e: e[0])[1] if errors else None


def _stalled_note(err: dict, workdir: Path, world_size: int) -> str:
    """After a collective timeout, name the ranks that raised nothing: they are the ones that stalled."""
    text = err["exception"].lower()
    if "timeout" not in text and "timed out" not in text:
        return ""
    quiet = [r for r in range(world_size) if not (workdir / f"rank{r}.error.json").exists()]
    where = f" at step {err['step']}" if err.get("step") is not None else ""
    return (f" — rank {err['rank']} timed out in a collective{where}; rank(s) {quiet} raised no error "
            f"and never joined it: they stalled.") if quiet else ""


def _signal_death(exc: Exception) -> dict | None:
    """A rank killed by a signal is the root cause; the others' errors (peer gone) follow from it."""
    failures = getattr(exc, "failures", {}) or {}
    dead = [f for f in failures.values() if f.exitcode is not None and f.exitcode < 0]
    if not dead:
        return None
    f = min(dead, key=lambda f: f.timestamp)
    return dict(rank=f.local_rank, traceback="",
                exception=f"rank {f.local_rank} (pid {f.pid}) was killed by signal {f.signal_name()}")


def _exit_error(exc: Exception) -> dict:
    """Error for ranks that died without writing one (killed, segfault): from elastic's report."""
    failures = getattr(exc, "failures", {}) or {}
    for _, f in sorted(failures.items(), key=lambda kv: getattr(kv[1], "timestamp", 0)):
        how = (f"killed by signal {f.signal_name()}" if f.exitcode < 0 else f"exited with code {f.exitcode}")
        return dict(rank=f.local_rank, exception=f"rank {f.local_rank} (pid {f.pid}) {how}", traceback="")
    return dict(rank=None, exception=f"{type(exc).__name__}: {exc}", traceback="")


def launch_ddp(cfg: RunConfig, plan: DevicePlan, out, run_id: str,
               should_stop: Callable[[], bool] | None, workdir: Path) -> torch.Tensor:
    """Run `cfg.world_size` DDP ranks on this host; returns rank 0's final parameters (P,).

    Raises:
        Canceled: `should_stop()` turned True.
        RankFailed: a rank raised or died; its error names the rank.
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from engine.ddp import rank_main

    for name in ("torch.distributed.elastic", "torch.multiprocessing"):  # errors reach the run's event
        logging.getLogger(name).setLevel(logging.CRITICAL)
    workdir.mkdir(parents=True, exist_ok=True)
    lc = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=cfg.world_size, run_id=run_id,
                      rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{free_port()}",
                      rdzv_configs={"timeout": RDZV_TIMEOUT_S}, max_restarts=0, monitor_interval=0.1,
                      start_method="spawn",
                      logs_specs=DefaultLogsSpecs(log_dir=str(workdir / "logs"), redirects=Std.ALL))
    follower = _Follower(workdir, cfg.world_size, out, should_stop)
    follower.start()
    try:
        elastic_launch(lc, rank_main)(cfg.to_json_dict(), run_id, str(workdir), plan.backend, plan.kind)
    except Exception as exc:
        follower.done.set()
        follower.join()
        follower.pump()
        if follower.canceled:
            raise Canceled("canceled: every rank process was stopped") from None
        err = _signal_death(exc) or _first_error(workdir, cfg.world_size) or _exit_error(exc)
        err["exception"] += _stalled_note(err, workdir, cfg.world_size)
        raise RankFailed(err) from None
    follower.done.set()
    follower.join()
    follower.pump()
    if follower.canceled:
        raise Canceled("canceled: every rank process was stopped")
    return torch.load(workdir / "final_params.pt")
