"""Starts DDP rank processes with torch.distributed's elastic launch and follows them.

`launch_ranks` runs `torch.distributed.launcher.api.elastic_launch` (the engine behind `torchrun`:
c10d rendezvous, ranks forked from a fork server that has imported torch once
(`engine.modes.ranks.prepare_fork_server`), no restarts) in this thread, while a follower thread
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
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ddpviz.engine.components.devices import DevicePlan
from ddpviz.engine.components.lifetime import is_live_child
from ddpviz.engine.components.ports import free_port  # noqa: F401 (engine.modes.launcher.free_port: its old home)
from ddpviz.engine.components.loop import Canceled
from ddpviz.engine.config import RunConfig
from ddpviz.engine.events import JsonlTail
from ddpviz.engine.batching import loss_event
from ddpviz.engine.measure.own_threads import name_this_thread
from ddpviz.engine.measure.turns import GATE_ENV
from ddpviz.engine.modes.ranks import prepare_fork_server

# How often rank event files are read and should_stop is polled: one hop of an event's way to
# Redis (see engine.batching.RANK_FLUSH_INTERVAL_S, which says what a wake-up costs and why 0.05 s).
FOLLOW_INTERVAL_S = 0.05
RDZV_TIMEOUT_S = 60  # rendezvous must complete within this many seconds
STALL_TIMEOUTS = 10  # ranks that report no step for this many collective timeouts have stalled (`_Follower`),
STALL_GAPS = 10  # ... and for this many times the longest wait between two steps so far


class RankFailed(RuntimeError):
    """A rank process failed; `.error` is {rank, exception, traceback}."""

    def __init__(self, error: dict):
        self.error = error
        super().__init__(error.get("exception", "rank failed"))


@dataclass(frozen=True)
class NodeSpec:
    """This host's part in a multi-host run (torch elastic c10d rendezvous).

    Attributes:
        nnodes: hosts in the run; each runs world_size // nnodes ranks.
        rdzv_endpoint: "host:port" of the rendezvous store, reachable from every host.
        is_host: this node serves the rendezvous store (exactly one node does).
        host_label: names this host in every rank's events (e.g. the worker's name).
        local_addr: the address other hosts reach this one at (becomes MASTER_ADDR when this
            node gets group rank 0); None = torch's default, this machine's FQDN.
    """

    nnodes: int = 1
    rdzv_endpoint: str | None = None
    is_host: bool = True
    host_label: str = ""
    local_addr: str | None = None


class _Follower(threading.Thread):
    """Forwards local ranks' events to the sink and kills them when `should_stop()` turns True, or when
    the ranks have stalled: no `step` event from any of them for `stall_s`, or for `STALL_GAPS` times the
    longest wait between two step events so far if that is longer (a run whose steps take minutes), after
    their first one, before the last step (`stalled`: (last step seen, seconds without one)). A stall no
    collective timeout ends (every rank stuck outside a collective, or inside a backend's own threads:
    PowerSGD on gloo with two buckets, `engine.modes.ddp.comm_hooks`) would otherwise hold the run until
    the job's time limit."""

    def __init__(self, workdir: Path, nproc: int, out, should_stop, stall_s: float | None = None,
                 last_step: int | None = None):
        super().__init__(name="ddpviz-rank-follower", daemon=True)
        self.tails = [JsonlTail(workdir / f"local{r}.jsonl") for r in range(nproc)]
        self.workdir, self.nproc, self.out, self.should_stop = workdir, nproc, out, should_stop
        self.done = threading.Event()
        self.canceled = False
        self.killed: set[int] = set()
        self.stall_s, self.last_step = stall_s, last_step
        self.step_seen, self.step_at = -1, None  # the latest step reported, and when (monotonic s)
        self.longest = 0.0  # the longest wait between two step events so far (s)
        self.stalled: tuple[int, float] | None = None
        # this run's rank fork server: the one seen while its ranks start. Only it may be killed: a follower that
        # outlived its run killed every server started after it, and another test's ranks failed to start
        # ("EOFError: unexpected EOF" from multiprocessing's forkserver, a clean-clone CI, 2026-12-06)
        self.server_pid: int | None = None

    def pump(self) -> None:
        for t in self.tails:
            for e in t.read_new():
                if e.get("type") == "step":
                    at = time.monotonic()
                    if self.step_at is not None:
                        self.longest = max(self.longest, at - self.step_at)
                    self.step_seen, self.step_at = max(self.step_seen, int(e.get("step") or 0)), at
                self.out.emit(e)

    def _check_stall(self) -> None:
        if self.stall_s is None or self.step_at is None or self.stalled is not None or \
                (self.last_step is not None and self.step_seen >= self.last_step):
            return
        quiet = time.monotonic() - self.step_at
        if quiet > max(self.stall_s, STALL_GAPS * self.longest):
            self.stalled = (self.step_seen, quiet)

    def kill_ranks(self) -> None:
        """SIGKILL every rank that has started and was not killed yet (each pid once, so a
        pid the OS hands out again later is never hit).

        While some rank has not started yet, the elastic agent may be blocked in the fork server
        (`_launch` waits for the pid of a fork the server makes only once its preloads, torch
        among them, are imported: tens of seconds on a busy machine), so the server is killed
        too: the agent's wait ends with an error at once, and ranks already forked die with the
        server (their PR_SET_PDEATHSIG). multiprocessing starts a new server for the next run
        (`ForkServer.ensure_running` relaunches a dead one).
        """
        infos = _local_infos(self.workdir, self.nproc)
        for info in infos.values():
            pid = int(info["pid"])
            if pid not in self.killed:
                self.killed.add(pid)
                with contextlib.suppress(Exception):
                    os.kill(pid, signal.SIGKILL)
        if len(infos) < self.nproc and self.server_pid is not None:
            kill_fork_server(self.server_pid)

    def run(self) -> None:
        name_this_thread()
        while not self.done.wait(FOLLOW_INTERVAL_S):
            if self.server_pid is None:  # the server this run's ranks come from (started or reused by its agent)
                self.server_pid = fork_server_pid()
            self.pump()
            if not self.canceled and self.should_stop is not None and self.should_stop():
                self.canceled = True
            self._check_stall()
            if self.canceled or self.stalled:  # every pass: a rank that starts after the cancel is stopped too
                self.kill_ranks()

    def finish(self) -> None:
        """Stop the thread, forward what the ranks wrote last, close the files."""
        self.done.set()
        self.join()
        self.pump()
        for t in self.tails:
            t.close()


def fork_server_pid() -> int | None:
    """The pid of this process's running rank fork server, or None. Reads multiprocessing's private
    `forkserver._forkserver._forkserver_pid` (CPython 3.8-3.13); None where that is missing."""
    from multiprocessing import forkserver

    pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    return pid if pid and is_live_child(pid) else None


def kill_fork_server(pid: int | None = None) -> bool:
    """SIGKILL this process's rank fork server if it runs (`pid`: only if that is the one); returns whether one
    was signalled. Where multiprocessing's private state is missing, nothing happens and the caller's other
    means of stopping remain.
    """
    current = fork_server_pid()
    pid = current if pid is None else pid
    if not pid or pid != current or pid in _FORK_SERVERS_KILLED:
        return False  # once each: a killed server's pid, once reaped, may belong to anyone
    _FORK_SERVERS_KILLED.add(pid)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
        return True
    return False


_FORK_SERVERS_KILLED: set[int] = set()




RankFollower = _Follower  # the bench drives the real forwarding path with stand-in ranks


def report_lost(workdir: Path, nproc: int, out, run_id: str) -> int:
    """Emit, for each local rank that left `local<L>.lost.json` (`engine.modes.ranks.write_lost`),
    the `log` event its own file could not carry (`engine.batching.loss_event`); returns the events
    lost in all."""
    total = 0
    for r in range(nproc):
        with contextlib.suppress(OSError, ValueError):
            lost = json.loads((workdir / f"local{r}.lost.json").read_text())
            out.emit(loss_event(lost["events_lost"], lost.get("error"), run_id,
                                rank=lost.get("rank")))
            total += int(lost["events_lost"])
    return total


def _local_infos(workdir: Path, nproc: int) -> dict[int, dict]:
    """{local rank: {rank, pid, host}} of the ranks that have started."""
    out = {}
    for r in range(nproc):
        with contextlib.suppress(Exception):
            out[r] = json.loads((workdir / f"local{r}.json").read_text())
    return out


def _own_error(workdir: Path, local_rank: int) -> dict | None:
    """The error rank `local_rank` wrote about itself (`local<L>.error.json`), or None."""
    with contextlib.suppress(OSError, ValueError):
        return json.loads((workdir / f"local{local_rank}.error.json").read_text())
    return None


def _first_error(workdir: Path, nproc: int) -> dict | None:
    errors = []
    for r in range(nproc):
        p = workdir / f"local{r}.error.json"
        err = _own_error(workdir, r)
        if err is not None:
            errors.append((p.stat().st_mtime, err))
    return min(errors, key=lambda e: e[0])[1] if errors else None


def _stalled_note(err: dict, workdir: Path, nproc: int) -> str:
    """After a collective timeout, name the ranks that raised nothing: they are the ones that stalled."""
    text = err["exception"].lower()
    if "timeout" not in text and "timed out" not in text:
        return ""
    infos = _local_infos(workdir, nproc)
    quiet = sorted(infos[r]["rank"] for r in infos if not (workdir / f"local{r}.error.json").exists())
    where = f" at step {err['step']}" if err.get("step") is not None else ""
    return (f" — rank {err['rank']} timed out in a collective{where}; rank(s) {quiet} raised no error "
            f"and never joined it: they stalled.") if quiet else ""


def _signal_death(exc: Exception, workdir: Path) -> dict | None:
    """A rank killed by a signal before it could say anything is the root cause; the others'
    errors (peer gone) follow from it.

    A rank that wrote its own exception (`local<L>.error.json`, written before it tears its
    process group down) does not count, even if it then died of a signal: that teardown can end
    in SIGABRT (gloo aborting on a peer that is gone, the store's host having exited), and its
    exception, not the signal, is what happened (`root_cause`).
    """
    failures = getattr(exc, "failures", {}) or {}
    dead = [f for f in failures.values() if f.exitcode is not None and f.exitcode < 0
            and _own_error(workdir, f.local_rank) is None]
    if not dead:
        return None
    f = min(dead, key=lambda f: f.timestamp)
    rank = f.local_rank + getattr(exc, "_rank_offset", 0)
    return dict(rank=rank, traceback="",
                exception=f"rank {rank} (pid {f.pid}) was killed by signal {f.signal_name()}")


def root_cause(exc: Exception, workdir: Path, nproc: int) -> dict:
    """The run's error from elastic's failure report and the ranks' own error files, in order:
    a rank killed without a word, else the earliest exception a rank wrote, else elastic's
    account of the exits."""
    return _signal_death(exc, workdir) or _first_error(workdir, nproc) or _exit_error(exc)


def _exit_error(exc: Exception) -> dict:
    """Error for ranks that died without writing one (killed, segfault): from elastic's report."""
    failures = getattr(exc, "failures", {}) or {}
    for _, f in sorted(failures.items(), key=lambda kv: getattr(kv[1], "timestamp", 0)):
        how = (f"killed by signal {f.signal_name()}" if f.exitcode < 0 else f"exited with code {f.exitcode}")
        rank = f.local_rank + getattr(exc, "_rank_offset", 0)
        return dict(rank=rank, exception=f"rank {rank} (pid {f.pid}) {how}", traceback="")
    return dict(rank=None, exception=f"{type(exc).__name__}: {exc}", traceback="")


def launch_ranks(cfg: RunConfig, plan: DevicePlan, out, run_id: str,
               should_stop: Callable[[], bool] | None, workdir: Path,
               node: NodeSpec | None = None, *, rank_fn: Callable) -> torch.Tensor | None:
    """Run this host's DDP ranks; returns global rank 0's final parameters (P,) if it ran here.

    `rank_fn` is what each rank process runs (`engine.modes.ddp.rank.rank_main` or
    `engine.modes.fsdp.rank.rank_main`: both the bootstrap of `engine.modes.ranks`, the same
    arguments, the same files).

    One host: `cfg.world_size` ranks, rendezvous on a free loopback port. Several hosts (`node`):
    `world_size // nnodes` ranks here, c10d rendezvous at `node.rdzv_endpoint`; a rank failing on
    any host ends the rendezvous round, so every host's ranks stop.

    Raises:
        Canceled: `should_stop()` turned True.
        RankFailed: a rank raised or died; its error names the rank (and host).
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    node = node or NodeSpec()
    for name in ("torch.distributed.elastic", "torch.multiprocessing"):  # errors reach the run's event
        logging.getLogger(name).setLevel(logging.CRITICAL)
    workdir.mkdir(parents=True, exist_ok=True)
    nproc = cfg.world_size // node.nnodes
    endpoint = node.rdzv_endpoint or f"127.0.0.1:{free_port()}"
    lc = LaunchConfig(min_nodes=node.nnodes, max_nodes=node.nnodes, nproc_per_node=nproc, run_id=run_id,
                      rdzv_backend="c10d", rdzv_endpoint=endpoint,
                      rdzv_configs={"timeout": RDZV_TIMEOUT_S, "is_host": node.is_host},
                      max_restarts=0, monitor_interval=0.1, start_method=prepare_fork_server(),
                      local_addr=node.local_addr,
                      logs_specs=DefaultLogsSpecs(log_dir=str(workdir / "logs"), redirects=Std.ALL))
    # a run taking turns (GATE_ENV) waits for its turn between steps; its turn controller times that out
    stall_s = None if os.environ.get(GATE_ENV) else STALL_TIMEOUTS * cfg.collective_timeout_s
    follower = _Follower(workdir, nproc, out, should_stop, stall_s, cfg.steps - 1)
    follower.start()
    try:
        elastic_launch(lc, rank_fn)(cfg.to_json_dict(), run_id, str(workdir), plan.backend, plan.kind,
                                      node.host_label, dict(os.environ))
        failure = None
    except Exception as exc:  # ChildFailedError, or the agent's own (rendezvous) errors
        failure = exc
    finally:  # never a follower left polling (and killing) after its run: a BaseException too ends it
        follower.finish()
    report_lost(workdir, nproc, out, run_id)
    if follower.canceled:
        raise Canceled("canceled: every rank process was stopped")
    if follower.stalled is not None:
        step, quiet = follower.stalled
        raise RankFailed(dict(rank=None, step=step + 1, traceback="", exception=(
            f"stalled: no rank reported a step for {quiet:.0f} s after step {step} ({STALL_TIMEOUTS} x "
            f"collective_timeout_s={cfg.collective_timeout_s:g} s, and {STALL_GAPS} x the longest wait between two "
            f"steps before, {follower.longest:.1f} s), with no collective timing out; every rank "
            f"process was stopped. Something waits forever outside a collective: a model's forward or backward, "
            f"a data loader, or a comm hook waiting inside the backend's own threads"))) from None
    if failure is not None:
        infos = _local_infos(workdir, nproc)
        failure._rank_offset = min((i["rank"] for i in infos.values()), default=0)
        err = root_cause(failure, workdir, nproc)
        err["exception"] += _stalled_note(err, workdir, nproc)
        raise RankFailed(err) from None
    params = workdir / "final_params.pt"
    return torch.load(params) if params.exists() else None
