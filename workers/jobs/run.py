"""The RQ job that runs one training run, and the hooks that settle runs RQ ends abnormally.

`execute_run(run_id)` is what the client enqueues (JSON args, never pickle). It runs in the RQ
work-horse, a process forked per job: torch and the engine are imported there, lazily, so the
client and the worker's main process never load torch. The worker runs no other function
(`ALLOWED_JOB_FUNCS`, enforced by `workers.worker.DdpvizJob`), and `execute_run` takes exactly one
argument, a run id of letters, digits, '-' and '_'; anything else is refused naming the field.

Endings and who records them:

| ending | recorded by | status |
|---|---|---|
| engine returns a RunResult | `run_job` | finished / failed / canceled |
| the run's time limit passes (`timeout_s`) | `run_job` (every rank killed first) | failed |
| the event stream cannot be kept (Redis gone too long) | `run_job` | failed |
| the job raises (engine bug, RQ's job timeout) | `run_job`, else `on_job_exception` | failed |
| work-horse killed (OOM killer, signal) | `on_horse_killed` (worker process) | failed |
| stopped by `send_stop_job_command` | `on_job_stopped` (worker process) and the client | canceled |
| worker killed: heartbeat gone | `workers.liveness` (other workers, the client) | lost |
| worker died; RQ cleans the abandoned job | `on_job_exception` (another worker) | lost |

A DP+DDP pair in turns is one job, `execute_pair` (`workers.jobs.pair`), whose runs each go through
`run_job` in a process of their own; the hooks below settle both runs of a pair job
(`keys.job_run_ids`), and `workers.jobs.pair` lists the endings it adds.

Each uses `RunStore.finish`, a compare-and-set, so the first terminal status wins (a job that
outlived a wrong `lost` verdict still records how it really ended).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
import traceback
from pathlib import Path
from typing import Any

import redis

from ddpviz.engine.config import ConfigError, validate_config
from ddpviz.engine.export import SAFE_ID
from ddpviz.workers import keys
from ddpviz.workers.host.reaper import RUN_ENV_VAR, kill_run_processes
from ddpviz.workers.host.stop import CANCEL_POLL_INTERVAL_S, StopPoller, fast_fail
from ddpviz.workers.store import ACTIVE, RunStatus, RunStore, make_error

log = logging.getLogger("ddpviz.worker")

# RQ stores a job's function by name: the names are the package's (`workers.jobs`), which
# re-exports them, so a module moving inside the package never strands a queued job.
JOB_FUNC = "ddpviz.workers.jobs.execute_run"  # enqueued by name
STOPPED_CALLBACK = "ddpviz.workers.jobs.on_job_stopped"
NODE_JOB_FUNC = "ddpviz.workers.jobs.execute_node"
PAIR_JOB_FUNC = "ddpviz.workers.jobs.execute_pair"  # a DP+DDP pair in turns (workers.jobs.pair)
# Names queued by an earlier release, still run (for one release) as the function they name now.
# Before the one import name (ddpviz.workers), jobs were queued as workers.*.
LEGACY_JOB_FUNCS = {"workers.node_job.execute_node": NODE_JOB_FUNC, "workers.jobs.execute_run": JOB_FUNC,
                    "workers.jobs.execute_node": NODE_JOB_FUNC}
# The only functions a worker runs. A deployment adds its own through DDPVIZ_EXTRA_JOB_FUNCS
# (comma-separated dotted names; the tests use it for stand-in jobs).
ALLOWED_JOB_FUNCS = (JOB_FUNC, NODE_JOB_FUNC, PAIR_JOB_FUNC, *LEGACY_JOB_FUNCS)  # + node jobs, pairs
EXTRA_JOB_FUNCS_ENV = "DDPVIZ_EXTRA_JOB_FUNCS"
JOB_TIMEOUT_S = 6 * 3600  # a run's time limit unless submitted with another (seconds)
JOB_TIMEOUT_GRACE_S = 60  # RQ's job timeout (SIGALRM in the horse) = the limit + this, a backstop
FINISH_RETRY_S = 60.0  # recording the end retries this long while Redis is away
CancelPoller = StopPoller  # the old name, kept for callers


class JobRefused(ValueError):
    """A job payload ddpviz does not run; the message names the field at fault."""


def allowed_job_funcs() -> set[str]:
    extra = os.environ.get(EXTRA_JOB_FUNCS_ENV, "")
    return set(ALLOWED_JOB_FUNCS) | {f.strip() for f in extra.split(",") if f.strip()}


def rq_job_timeout(time_limit_s: float | None) -> int:
    """RQ's job timeout for a run with this time limit (seconds)."""
    return int(time_limit_s or JOB_TIMEOUT_S) + JOB_TIMEOUT_GRACE_S


def default_worker_name() -> str:
    """``host-pid``: unique among live workers (RQ refuses two live workers with one name)."""
    return f"{socket.gethostname()}-{os.getpid()}"


def check_run_id(args: tuple, kwargs: dict) -> str:
    """The run id of an `execute_run` call, or JobRefused naming what is wrong."""
    if kwargs:
        raise JobRefused(f"job payload: kwargs must be empty; execute_run takes only run_id "
                         f"(got {sorted(map(str, kwargs))[:5]})")
    if len(args) != 1:
        raise JobRefused(f"job payload: args must be [run_id] (got {len(args)} arguments)")
    run_id = args[0]
    if not isinstance(run_id, str) or not SAFE_ID.match(run_id):
        shown = repr(run_id)
        raise JobRefused(f"job payload: run_id must be 1-64 letters, digits, '-' or '_' "
                         f"(got {shown[:40] + '...' if len(shown) > 40 else shown})")
    return run_id


def execute_run(*args: Any, **kwargs: Any) -> str:
    """RQ job: run the stored run `run_id` (the only argument) and record how it ended.

    Returns:
        the final status (``finished``, ``failed``, ``canceled``), stored by RQ as the result.

    Raises:
        JobRefused: the arguments are not exactly one valid run id.
        LookupError: there is no run record `run_id`.
    """
    from rq import get_current_job

    run_id = check_run_id(args, kwargs)
    job = get_current_job()
    if job is not None:
        connection, worker = job.connection, job.worker_name or os.environ.get("RQ_WORKER_ID")
    else:  # called directly, outside a worker
        from ddpviz.workers.connection import connect

        connection, worker = connect(), None
    return run_job(connection, run_id, worker_name=worker or default_worker_name())


def stored_config(store: RunStore, run_id: str) -> Any:
    """The run's stored config as JSON data, not yet validated.

    Raises:
        ConfigError: the stored config is not valid JSON (field ``config``).
    """
    raw = store.redis.hget(keys.run(run_id), "config")
    try:
        return json.loads(raw or b"null")
    except ValueError as exc:
        raise ConfigError([("config", f"config is not valid JSON ({exc})")]) from None


def run_job(connection: redis.Redis, run_id: str, *, worker_name: str,
            workdir: str | Path | None = None, stream_maxlen: int | None = None,
            heartbeat_run: str | None = None) -> str:
    """Validate, mark started, lease GPUs, train with events going to the run's stream, record
    the end.

    A config that no longer validates (e.g. a plugin model uninstalled since submit, or a record
    written by something other than the client) fails the run without starting it; a run
    canceled while queued is not started at all.

    Args:
        stream_maxlen: cap on the run's event stream (default `DEFAULT_STREAM_MAXLEN`).
        heartbeat_run: what the worker's heartbeat names as its current run (default `run_id`;
            a pair's job names both, ``"dp,ddp"``, as `workers.worker` does).

    Returns:
        the final status value.

    Raises:
        LookupError: the record is missing.
    """
    store = RunStore(connection) if stream_maxlen is None else RunStore(connection, stream_maxlen)
    record = store.get(run_id)
    if record is None:
        raise LookupError(f"run_id: no run record {run_id!r}")
    try:
        cfg = validate_config(stored_config(store, run_id))
    except ConfigError as exc:
        store.finish(run_id, RunStatus.FAILED, error=make_error(f"ConfigError: {exc}", stage="config"),
                     allowed_from=ACTIVE, append_event=True)
        return store.status(run_id).value
    if not store.mark_started(run_id, worker_name):
        return store.status(run_id).value  # canceled before we got to it
    from ddpviz.workers.heartbeat import set_current_run

    set_current_run(connection, worker_name, heartbeat_run or run_id)
    status, error, summary, reported = _train(store, cfg, run_id, workdir,
                                              record.get("timeout_s") or JOB_TIMEOUT_S, worker_name)
    final = _record_end(store, run_id, status, error, summary, reported)
    from ddpviz.workers.retention import retain_quietly

    retain_quietly(connection, worker_name)  # old runs go once this one has ended
    return final


def _record_end(store: RunStore, run_id: str, status: RunStatus, error: dict | None,
                summary: dict | None, reported: bool) -> str:
    """Record the end, retrying for `FINISH_RETRY_S` while Redis is unreachable."""
    deadline = time.monotonic() + FINISH_RETRY_S
    while True:
        try:
            store.finish(run_id, status, error=error, summary=summary, append_event=not reported,
                         allowed_from=(RunStatus.STARTED, RunStatus.LOST))
            return store.status(run_id).value
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if time.monotonic() > deadline:
                raise
            log.warning("run %s: cannot record its end yet (%s); retrying", run_id, exc)
            time.sleep(1.0)


def _lease_gpus(store: RunStore, cfg: Any, run_id: str, poller: StopPoller, sink: Any):
    """Lease the GPUs the run needs on this host (`workers.host.leases`); sets CUDA_VISIBLE_DEVICES.

    Returns:
        the DeviceLease (None when the run uses no GPU), or False when stopped while waiting.
    """
    if cfg.device == "cpu":
        return None
    from ddpviz.engine.events import make_event
    from ddpviz.workers.host.gpus import GpuMonitor
    from ddpviz.workers.host.leases import DeviceLease, gpus_needed

    monitor = GpuMonitor()
    gpus = monitor.inventory()
    monitor.close()
    n = gpus_needed(cfg, len(gpus))
    if n == 0 or len(gpus) < n:
        return None  # CPU, or too few GPUs: the engine's pre-flight check says so
    lease = DeviceLease(store.redis, socket.gethostname(), run_id)

    def on_wait(holders: list[str]) -> None:
        sink.emit(make_event("log", run_id, level="info", message=(
            f"waiting for {n} free GPU(s) on {socket.gethostname()}; in use by run(s) {holders}")))

    got = lease.acquire([g["uuid"] for g in gpus], n, should_stop=poller, on_wait=on_wait)
    if got is None:
        return False
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(got)
    return lease


class StartedRecorder:
    """Passes events on to `sink`; the `run_started` event gets this worker's name as `host`
    (the engine only knows the machine's `hostname`) and is kept in the run record too
    (`RunStore.save_started`), since a long run's capped stream trims it."""

    def __init__(self, sink: Any, store: RunStore, run_id: str, worker: str):
        self.sink, self.store, self.run_id, self.worker = sink, store, run_id, worker

    def emit(self, event: dict[str, Any]) -> None:
        if event.get("type") == "run_started":
            event = {**event, "host": event.get("host") or self.worker}
            try:
                self.store.save_started(self.run_id, event)
            except redis.RedisError as exc:  # the stream still has it; the run goes on
                log.warning("run %s: could not keep run_started in the record: %s", self.run_id, exc)
        self.sink.emit(event)

    def close(self) -> None:
        self.sink.close()


def _train(store: RunStore, cfg: Any, run_id: str, workdir: str | Path | None,
           time_limit_s: float, worker_name: str = ""):
    """Run the engine. Returns (status, error, summary, engine_reported_run_finished).

    The time limit counts from here, the run's start, not from the end of the imports that
    follow (torch's take seconds, tens on a busy host).
    """
    deadline = time.monotonic() + time_limit_s if time_limit_s else None
    from ddpviz.engine.run import run_training  # imports torch: only in the work-horse
    from ddpviz.workers.sink import run_sink

    sink, writer = run_sink(store.redis, run_id, store.stream_maxlen)
    sink = StartedRecorder(sink, store, run_id, worker_name or default_worker_name())
    poll_client = fast_fail(store.redis)
    poller = StopPoller(RunStore(poll_client), run_id, CANCEL_POLL_INTERVAL_S,
                        time_limit_s=time_limit_s, writer=writer, deadline=deadline)
    saved = {k: os.environ.get(k) for k in (RUN_ENV_VAR, "CUDA_VISIBLE_DEVICES")}
    os.environ[RUN_ENV_VAR] = run_id  # marks every process of this run (see workers.host.reaper)
    lease = None
    status, error, summary, reported = RunStatus.CANCELED, None, None, False
    try:
        lease = _lease_gpus(store, cfg, run_id, poller, sink)
        if lease is not False:
            result = run_training(cfg, sink, run_id, should_stop=poller, workdir=workdir)
            status, error, summary, reported = RunStatus(result.status), result.error, result.summary, True
    except Exception as exc:  # an engine bug or RQ's job timeout: still settle the run
        status, summary, reported = RunStatus.FAILED, None, False
        error = make_error(f"{type(exc).__name__}: {exc}", traceback.format_exc())
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        try:
            sink.close()
        except Exception as exc:  # the stream's tail is lost; the record still gets the end
            log.warning("run %s: event stream flush failed: %s", run_id, exc)
            reported = False
        if lease:
            lease.release()
        poll_client.close()
        # Whatever the ending, no process of the run outlives it: the rank fork server this
        # work-horse started (it holds the run's environment and torch; no later run uses it) is
        # killed now rather than when the horse exits, what escaped is reaped now, and this
        # process's other children (multiprocessing's resource tracker) end with it.
        stop_fork_server()
        kill_run_processes(run_id, spare_children_of=os.getpid())
    if status is RunStatus.CANCELED:
        status, error = _stop_outcome(poller, error)
    return status, error, summary, reported


def stop_fork_server() -> None:
    """SIGKILL this work-horse's rank fork server, if one runs (`engine.modes.launcher.kill_fork_server`)."""
    from ddpviz.engine.modes.launcher import kill_fork_server  # torch: the work-horse has it already

    try:
        kill_fork_server()
    except Exception as exc:  # the reaper and the server's parent watch remain
        log.warning("could not stop the rank fork server: %s", exc)


def _stop_outcome(poller: StopPoller, error: dict | None) -> tuple[RunStatus, dict]:
    """The status and error of a run the engine reports canceled, by why it was stopped."""
    said = (error or {}).get("exception")
    tb, rank = (error or {}).get("traceback"), (error or {}).get("rank")
    if poller.kind == "timeout":
        return RunStatus.FAILED, make_error(f"JobTimeout: {poller.reason}; every process of the "
                                            f"run was stopped", tb, rank)
    if poller.kind == "stream":
        return RunStatus.FAILED, make_error(f"{poller.reason}; the run was stopped", tb, rank)
    if said and said.lower().startswith("canceled: "):  # the engine's own word for it, said once already
        said = said[len("canceled: "):]
    return RunStatus.CANCELED, make_error(
        f"Canceled: {poller.reason or 'canceled'}" + (f" ({said})" if said else ""), tb, rank)


# -- hooks for endings RQ handles (registered by workers.worker and at enqueue) ---------------

def on_job_exception(job: Any, exc_type: type | None, exc_value: BaseException | None,
                     tb: Any) -> bool:
    """RQ exception handler: the job raised (in the horse), or RQ found it abandoned.

    Returns True so later handlers still run.
    """
    name = exc_type.__name__ if exc_type is not None else "Error"
    if name == "AbandonedJobError":
        from ddpviz.workers.keys import pair_or_run
        from ddpviz.workers.liveness import lost_error

        for run_id in pair_or_run(job.id):  # both runs of a pair job
            _settle(job.connection, run_id, RunStatus.LOST,
                    lost_error(run_id, getattr(job, "worker_name", None) or "?"), allowed_from=[RunStatus.STARTED])
        return True
    message = f"{name}: {exc_value}"
    text = "".join(traceback.format_exception(exc_type, exc_value, tb)) if tb is not None else None
    _settle(job.connection, job.id, RunStatus.FAILED, make_error(message, text))
    return True


def on_horse_killed(job: Any, retpid: int | None, ret_val: int | None, rusage: Any) -> None:
    """RQ work-horse-killed handler (in the worker process): fail the run (both of a pair job),
    reap its processes."""
    how = f"exit status {ret_val}"
    if ret_val is not None and os.WIFSIGNALED(ret_val):
        sig = os.WTERMSIG(ret_val)
        how = f"signal {sig} ({signal.Signals(sig).name})" if sig in signal.valid_signals() else \
              f"signal {sig}"
    elif ret_val is not None and os.WIFEXITED(ret_val):
        how = f"exit code {os.WEXITSTATUS(ret_val)}"
    message = (f"WorkHorseKilled: the process running this job (pid {retpid}) ended unexpectedly "
               f"with {how}; out of memory is the usual cause")
    _settle(job.connection, job.id, RunStatus.FAILED, make_error(message))
    _reap(job.id)


def _reap(job_id: str) -> None:
    from ddpviz.workers.keys import pair_or_run

    for run_id in pair_or_run(job_id):  # both runs of a pair job
        kill_run_processes(run_id)


def on_job_stopped(job: Any, connection: redis.Redis) -> None:
    """RQ stopped callback (in the worker process, after it killed the horse on a stop-job
    command): mark the run (both of a pair job) canceled and reap any rank process that escaped
    the process group."""
    _settle(connection, job.id, RunStatus.CANCELED,
            make_error("Canceled: the run did not stop in time after a cancel request, so its "
                       "work-horse process group was killed"))
    _reap(job.id)


def _settle(connection: redis.Redis, job_id: str, status: RunStatus, error: dict,
            allowed_from: Any = ACTIVE) -> None:
    if not isinstance(job_id, str) or not SAFE_ID.match(job_id):
        return  # a refused payload with an id no run can have
    from ddpviz.workers.keys import pair_or_run

    for run_id in pair_or_run(job_id):  # a pair job carries two runs
        _settle_run(connection, run_id, status, error, allowed_from)


def _settle_run(connection: redis.Redis, run_id: str, status: RunStatus, error: dict,
                allowed_from: Any) -> None:
    try:
        from ddpviz.workers.jobs.nodes import settle_node_job

        if settle_node_job(connection, run_id, status, error):  # a node job of a multi-host run
            return
        if RunStore(connection).finish(run_id, status, error=error, allowed_from=allowed_from,
                                       append_event=True):
            log.warning("run %s: %s (%s)", run_id, status.value, error["exception"])
    except redis.RedisError as exc:
        log.error("run %s: could not record %s: %s", run_id, status.value, exc)
