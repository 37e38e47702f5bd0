"""The RQ job that trains a DP+DDP pair at once, taking turns of blocks of steps.

On a shared host the step time of the same loop drifts 30-60% over seconds, so a pair run one
after the other compares the machine's moments, not the modes (`engine.measure.turns`). The app's
pair (`DdpvizClient.submit_pair`) is one job, `execute_pair(dp_run_id, ddp_run_id)`, whose
work-horse hands out turns (`engine.measure.turns.TurnController`, the order rotated each round as
`ddpviz compare --turns` does, `engine.harness.interleaved.rotated_order`) and runs each run in a
child process of its own through the single-run path (`workers.jobs.run.run_job`) with
`GATE_ENV` set: each run keeps its own record, event stream, status, summary, cancel flag, time
limit and GPU lease, and `run_job` records each ending as its docstring's table says. A process
per run is needed: `run_job` sets process-wide environment (the run id that marks every process
of a run for `workers.host.reaper`).

Turn size: `engine.measure.turns.pair_turn_steps` (the one home of the rule), planned at submit
and kept in both records' ``pair`` field (`pair_plan`). A pair it gives no turn size is still
this job, its runs one after the other, and both runs' first event and the Live page say why; so
is a pair whose GPUs this host cannot give to both runs at once (`gpu_shortfall`).

Endings beyond `run_job`'s, per run of the pair:

| ending | recorded by | status |
|---|---|---|
| the DDP run's comm hook refused in pre-flight (`engine.runner.comm_hook_refusal`) | `_refused`, before either starts | both failed: DDP with the refusal, DP "not started" |
| one run ends early (canceled, failed, time limit) | its `run_job`; the other trains on alone | its own |
| its cancel not obeyed within `KILL_AFTER_S` | the client; `_Supervisor` kills its processes | canceled |
| a run's process dies without recording | `_settle_left` after it exits | failed (canceled if asked) |
| the pair job raises, is stopped, its horse killed | `workers.jobs.run`'s hooks, for both runs | failed / canceled |
| the worker dies | `workers.liveness`, for both runs (both name the worker) | lost |
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import threading
import time
from typing import Any

import redis

from ddpviz.engine.export import SAFE_ID
from ddpviz.engine.measure.turns import GATE_ENV, pair_turn_steps
from ddpviz.workers import keys
from ddpviz.workers.jobs.run import JOB_TIMEOUT_S, JobRefused, default_worker_name, run_job, stored_config
from ddpviz.workers.store import ACTIVE, RunStatus, RunStore, make_error

log = logging.getLogger("ddpviz.worker")

CANCEL_WAIT_S = 3.0  # as workers.client.CANCEL_WAIT_S: a run asked to cancel gets this long (s)
KILL_AFTER_S = CANCEL_WAIT_S + 1.0  # then the pair's job kills that run's processes (s)
SUPERVISE_INTERVAL_S = 0.25  # between looks at the runs' cancel flags and processes (s)
CHILD_EXIT_WAIT_S = 30.0  # a run's process gets this long to exit after its run ended (s)


def pair_plan(dp_run_id: str, ddp_run_id: str, steps: int, nnodes: int = 1) -> dict[str, Any]:
    """The ``pair`` field of both records: ``{job_id, runs, turn_steps, why}``.

    `turn_steps` is the steps per turn (`engine.measure.turns.pair_turn_steps`), or None when the
    runs go one after the other, `why` the sentence saying which and why. A multi-host pair
    (`nnodes` > 1) does not take turns: one host's controller cannot see the other hosts' ranks.

    Raises:
        ValueError: `steps` is not an integer >= 1 (naming ``steps``).
    """
    turn_steps, why = pair_turn_steps(steps)
    if nnodes > 1:
        turn_steps, why = None, f"a run over nnodes={nnodes} hosts cannot take turns from one worker"
    return {"job_id": keys.pair_job_id(dp_run_id, ddp_run_id), "runs": [dp_run_id, ddp_run_id],
            "turn_steps": turn_steps, "why": why}


def check_pair_ids(args: tuple, kwargs: dict) -> tuple[str, str]:
    """The two run ids of an `execute_pair` call, or JobRefused naming what is wrong."""
    if kwargs:
        raise JobRefused(f"job payload: kwargs must be empty; execute_pair takes only "
                         f"[dp_run_id, ddp_run_id] (got {sorted(map(str, kwargs))[:5]})")
    if len(args) != 2:
        raise JobRefused(f"job payload: args must be [dp_run_id, ddp_run_id] (got {len(args)} arguments)")
    for name, run_id in zip(("dp_run_id", "ddp_run_id"), args):
        if not isinstance(run_id, str) or not SAFE_ID.match(run_id):
            shown = repr(run_id)
            raise JobRefused(f"job payload: {name} must be 1-64 letters, digits, '-' or '_' "
                             f"(got {shown[:40] + '...' if len(shown) > 40 else shown})")
    if args[0] == args[1]:
        raise JobRefused(f"job payload: dp_run_id and ddp_run_id must differ (both {args[0]!r})")
    return args[0], args[1]


def execute_pair(*args: Any, **kwargs: Any) -> str:
    """RQ job: train the stored runs `dp_run_id` and `ddp_run_id` at once, in turns (or one
    after the other, as their ``pair`` field says), and record how each ended.

    Returns:
        ``"{dp status} {ddp status}"``, stored by RQ as the result.

    Raises:
        JobRefused: the arguments are not two distinct valid run ids.
        LookupError: a run record is missing.
    """
    from rq import get_current_job

    dp, ddp = check_pair_ids(args, kwargs)
    job = get_current_job()
    if job is not None:
        connection, worker = job.connection, job.worker_name or os.environ.get("RQ_WORKER_ID")
    else:  # called directly, outside a worker
        from ddpviz.workers.connection import connect

        connection, worker = connect(), None
    got = run_pair(connection, dp, ddp, worker_name=worker or default_worker_name())
    return " ".join(got[r] for r in (dp, ddp))


def gpu_shortfall(configs: list[Any]) -> str | None:
    """Why this host cannot train these runs at once on GPUs of their own, or None when it can
    (both on CPU, or enough GPUs for both leases, `workers.host.leases.gpus_needed`). Two runs on
    one GPU would share its memory and NVML's device-wide figures."""
    if all(c is None or c.device == "cpu" for c in configs):
        return None
    from ddpviz.workers.host.gpus import GpuMonitor
    from ddpviz.workers.host.leases import gpus_needed

    monitor = GpuMonitor()
    try:
        visible = len(monitor.inventory())
    finally:
        monitor.close()
    need = sum(gpus_needed(c, visible) for c in configs if c is not None)
    if need == 0 or need <= visible:
        return None
    return (f"this host has {visible} GPU(s) and DP and DDP at once need {need}, so they run one "
            f"after the other")


def _config(store: RunStore, run_id: str) -> Any:
    from ddpviz.engine.config import ConfigError, validate_config

    try:
        return validate_config(stored_config(store, run_id))
    except ConfigError:
        return None  # run_job fails the run with the reason


def _say(store: RunStore, run_id: str, message: str) -> None:
    from ddpviz.engine.events import make_event
    from ddpviz.workers.sink import add_event

    add_event(store.redis, run_id, make_event("log", run_id, level="info", message=message),
              store.stream_maxlen)


def run_pair(connection: redis.Redis, dp_run_id: str, ddp_run_id: str, *, worker_name: str) -> dict[str, str]:
    """Train both runs, each in a child process through `run_job`, in turns when their ``pair``
    plan has a turn size and this host can hold both at once; returns run id -> final status.

    Raises:
        LookupError: a run record is missing.
    """
    store = RunStore(connection)
    runs = [dp_run_id, ddp_run_id]
    records = {r: store.get(r) for r in runs}
    missing = [r for r, rec in records.items() if rec is None]
    if missing:
        raise LookupError(f"run_id: no run record {missing[0]!r}")
    configs = {r: _config(store, r) for r in runs}
    steps = next((c.steps for c in configs.values() if c is not None), 1)
    plan = dict(records[dp_run_id].get("pair") or pair_plan(dp_run_id, ddp_run_id, steps))  # enqueued by hand
    block = plan.get("turn_steps")
    shortfall = gpu_shortfall(list(configs.values())) if block else None
    if shortfall:
        plan.update(turn_steps=None, why=shortfall)
        for r in runs:
            connection.hset(keys.run(r), "pair", json.dumps(plan))
    block = plan.get("turn_steps")
    how = (f"DP and DDP train at once on worker {worker_name}, {plan['why']}: the order swaps each "
           f"round and step times leave out the waits" if block else
           f"DP and DDP run one after the other on worker {worker_name}: {plan['why']}")
    for r in runs:
        if store.status(r) is RunStatus.QUEUED:  # not one canceled while queued
            _say(store, r, how)
    if _refused(store, dp_run_id, ddp_run_id, configs.get(ddp_run_id)):
        return {r: (store.status(r) or RunStatus.FAILED).value for r in runs}
    limit_s = max(float(rec.get("timeout_s") or 0) for rec in records.values()) or JOB_TIMEOUT_S
    supervisor = _Supervisor(store, runs)
    try:
        if block:
            _in_turns(connection, runs, configs, steps, block, worker_name, supervisor, plan, limit_s)
        else:
            for r in runs:
                supervisor.start(connection, r, worker_name, None, ",".join(runs))
                supervisor.join([r])
    finally:
        supervisor.stop()
    return {r: (store.status(r) or RunStatus.FAILED).value for r in runs}


def _refused(store: RunStore, dp_run_id: str, ddp_run_id: str, ddp_cfg: Any) -> bool:
    """Fail both runs before either starts when the DDP run's pre-flight refuses its comm hook
    (`engine.runner.comm_hook_refusal`: e.g. PowerSGD on gloo over two buckets, which would hang): the DDP run
    with the refusal, the DP run saying it was not started for a comparison that cannot happen. Returns
    whether it did."""
    from ddpviz.engine.runner import comm_hook_refusal

    refusal = comm_hook_refusal(ddp_cfg) if ddp_cfg is not None else None
    if refusal is None:
        return False
    store.finish(ddp_run_id, RunStatus.FAILED, error=make_error(refusal, stage="pre-flight"),
                 allowed_from=ACTIVE, append_event=True)
    store.finish(dp_run_id, RunStatus.FAILED, error=make_error(
        f"not started: its DDP partner was refused in pre-flight, so there is nothing to compare with ({refusal})",
        stage="pre-flight"), allowed_from=ACTIVE, append_event=True)
    return True


def _in_turns(connection: redis.Redis, runs: list[str], configs: dict[str, Any], steps: int, block: int,
              worker_name: str, supervisor: "_Supervisor", plan: dict, limit_s: float) -> None:
    """Both runs' processes started at once with the gate set; turns handed out until both end.
    The controller waits at most the runs' time limit `limit_s` (s) for a rank or a block (the
    runs' own limits stop them first)."""
    from ddpviz.engine.harness.interleaved import gate_ranks, rotated_order
    from ddpviz.engine.measure.turns import TurnController

    ranks = {r: gate_ranks(c) if c is not None else 1 for r, c in configs.items()}
    ctl = TurnController(ranks, block, timeout_s=limit_s)
    for r in runs:
        supervisor.start(connection, r, worker_name, ctl.spec, ",".join(runs))
    try:
        ctl.run(rotated_order(runs, steps // block), side_alive=supervisor.alive)
    except (RuntimeError, TimeoutError, OSError, EOFError) as exc:  # a rank that never connected, a
        # block past the limit: the runs waiting at the gate get EOF and fail; RQ's job timeout goes on up
        log.error("pair %s: the turns stopped: %s", plan.get("job_id"), exc)
    finally:
        ctl.close()
        for side, why in ctl.dropped.items():
            log.info("pair %s: run %s left the turns (%s); the other trained on alone",
                     plan.get("job_id"), side, why)
        supervisor.join(runs)


def _side(connection: redis.Redis, run_id: str, worker_name: str, gate_spec: str | None,
          heartbeat_run: str, parent_pid: int) -> None:
    """One run of the pair, in a child process of the pair's work-horse."""
    from ddpviz.engine.components.lifetime import die_with_parent

    die_with_parent(parent_pid)  # the horse killed (OOM, stop-job): this run goes with it
    if gate_spec:
        os.environ[GATE_ENV] = gate_spec
    else:
        os.environ.pop(GATE_ENV, None)
    connection.connection_pool.reset()  # the horse's sockets stay the horse's
    run_job(connection, run_id, worker_name=worker_name, heartbeat_run=heartbeat_run)


class _Supervisor:
    """The pair's run processes: started by `start`, watched from a thread of the horse.

    A run whose cancel flag has been set for `KILL_AFTER_S` while its process still runs (its
    loop did not reach a stop check) has that process and its rank processes killed: the client,
    which no longer sends RQ's stop-job command for a pair member (it would kill both), has
    recorded it canceled at `CANCEL_WAIT_S`.
    """

    def __init__(self, store: RunStore, runs: list[str]):
        self.store, self.runs = store, runs
        self.procs: dict[str, Any] = {}
        self._asked: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ddpviz-pair-supervisor", daemon=True)
        self._thread.start()

    def start(self, connection: redis.Redis, run_id: str, worker_name: str, gate_spec: str | None,
              heartbeat_run: str) -> None:
        ctx = mp.get_context("fork")  # the horse has torch imported (workers.worker.warm_up)
        proc = ctx.Process(target=_side, name=f"ddpviz-pair-{run_id}", daemon=False,
                           args=(connection, run_id, worker_name, gate_spec, heartbeat_run, os.getpid()))
        proc.start()
        self.procs[run_id] = proc

    def alive(self, run_id: str) -> bool:
        proc = self.procs.get(run_id)
        return proc is not None and proc.is_alive()

    def join(self, runs: list[str]) -> None:
        """Wait for the runs' processes to end, then record what they could not."""
        for r in runs:
            proc = self.procs.get(r)
            if proc is None:
                continue
            while proc.is_alive():
                proc.join(timeout=1.0)
                if self.store.status(r) not in ACTIVE and proc.is_alive():
                    proc.join(timeout=CHILD_EXIT_WAIT_S)
                    if proc.is_alive():  # ended but stuck exiting
                        self._kill(r)
            _settle_left(self.store, r, proc.exitcode)

    def _loop(self) -> None:
        while not self._stop.wait(SUPERVISE_INTERVAL_S):
            for r, proc in list(self.procs.items()):
                try:
                    asked = proc.is_alive() and self.store.cancel_reason(r) is not None
                except redis.RedisError:
                    continue
                if not asked:
                    self._asked.pop(r, None)
                    continue
                first = self._asked.setdefault(r, time.monotonic())
                if time.monotonic() - first >= KILL_AFTER_S:
                    log.warning("pair: run %s did not stop within %.0f s of its cancel; killing it", r, KILL_AFTER_S)
                    self._kill(r)

    def _kill(self, run_id: str) -> None:
        from ddpviz.workers.host.reaper import kill_run_processes

        proc = self.procs[run_id]
        if proc.is_alive():
            proc.kill()
        kill_run_processes(run_id)  # its rank processes (they carry the run's mark)

    def stop(self) -> None:
        """Stop watching; kill any run process still alive (the job itself is ending)."""
        self._stop.set()
        for r, proc in self.procs.items():
            if proc.is_alive():
                self._kill(r)
                proc.join(timeout=5.0)
                _settle_left(self.store, r, proc.exitcode)


def _settle_left(store: RunStore, run_id: str, exitcode: int | None) -> None:
    """Record the end of a run whose process exited without recording it (killed, crashed)."""
    try:
        if store.status(run_id) not in ACTIVE:
            return
        reason = store.cancel_reason(run_id)
        if reason is not None:
            status, error = RunStatus.CANCELED, make_error(
                f"Canceled: {reason}; the run did not stop in time, so the pair's job killed its processes")
        else:
            status, error = RunStatus.FAILED, make_error(
                f"RunProcessDied: the process running this run of the pair ended with exit code "
                f"{exitcode} before recording its end")
        store.finish(run_id, status, error=error, allowed_from=ACTIVE, append_event=True)
    except redis.RedisError as exc:
        log.error("run %s: could not record its end: %s", run_id, exc)
