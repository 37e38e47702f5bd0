"""The RQ job that runs one training run, and the hooks that settle runs RQ ends abnormally.

`execute_run(run_id)` is what the client enqueues (JSON args, never pickle). It runs in the RQ
work-horse, a process forked per job: torch and the engine are imported there, lazily, so the
client and the worker's main process never load torch.

Endings and who records them:

| ending | recorded by | status |
|---|---|---|
| engine returns a RunResult | `run_job` | finished / failed / canceled |
| the job raises (engine bug, job timeout) | `run_job`, else `on_job_exception` | failed |
| work-horse killed (OOM killer, signal) | `on_horse_killed` (worker process) | failed |
| stopped by `send_stop_job_command` | `on_job_stopped` (worker process) and the client | canceled |
| worker died; RQ cleans the abandoned job | `on_job_exception` (another worker) | failed |

Each uses `RunStore.finish`, a compare-and-set, so the first terminal status wins.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
import traceback
from pathlib import Path
from typing import Any

import redis

from engine.config import ConfigError, validate_config
from workers.reaper import RUN_ENV_VAR, kill_run_processes
from workers.store import ACTIVE, FROM_ENGINE, RunStatus, RunStore, make_error

log = logging.getLogger("ddpviz.worker")

JOB_FUNC = "workers.jobs.execute_run"  # enqueued by name
STOPPED_CALLBACK = "workers.jobs.on_job_stopped"
JOB_TIMEOUT_S = 6 * 3600  # RQ kills a job running longer than this (SIGALRM in the horse)
CANCEL_POLL_INTERVAL_S = 0.2  # the engine may poll should_stop often; Redis is asked at ~5 Hz


class CancelPoller:
    """``should_stop`` for the engine: True once the run's cancel flag is set.

    Asks Redis at most once per `interval_s` seconds; a Redis error counts as "not canceled"
    (a telemetry hiccup must not kill a run). Once True, stays True.
    """

    def __init__(self, store: RunStore, run_id: str, interval_s: float = CANCEL_POLL_INTERVAL_S):
        self.store = store
        self.run_id = run_id
        self.interval_s = interval_s
        self.reason: str | None = None
        self._next_check = 0.0

    def __call__(self) -> bool:
        if self.reason is not None:
            return True
        now = time.monotonic()
        if now < self._next_check:
            return False
        self._next_check = now + self.interval_s
        try:
            self.reason = self.store.cancel_reason(self.run_id)
        except redis.RedisError as exc:
            log.warning("run %s: cannot read the cancel flag: %s", self.run_id, exc)
        return self.reason is not None


def default_worker_name() -> str:
    """``host-pid``: unique among live workers (RQ refuses two live workers with one name)."""
    return f"{socket.gethostname()}-{os.getpid()}"


def execute_run(run_id: str) -> str:
    """RQ job: run the stored run `run_id` and record how it ended.

    Returns:
        the final status (``finished``, ``failed``, ``canceled``), stored by RQ as the result.

    Raises:
        LookupError: there is no run record `run_id`.
    """
    from rq import get_current_job

    job = get_current_job()
    if job is not None:
        connection, worker = job.connection, job.worker_name or os.environ.get("RQ_WORKER_ID")
    else:  # called directly, outside a worker
        from workers.connection import connect

        connection, worker = connect(), None
    return run_job(connection, run_id, worker_name=worker or default_worker_name())


def run_job(connection: redis.Redis, run_id: str, *, worker_name: str,
            workdir: str | Path | None = None) -> str:
    """Validate, mark started, train with events going to the run's stream, record the end.

    A config that no longer validates (e.g. a plugin model uninstalled since submit) fails the
    run without starting it; a run canceled while queued is not started at all.

    Returns:
        the final status value. Raises LookupError when the record is missing.
    """
    store = RunStore(connection)
    record = store.get(run_id)
    if record is None:
        raise LookupError(f"no run record {run_id!r}")
    try:
        cfg = validate_config(record["config"])
    except ConfigError as exc:
        store.finish(run_id, RunStatus.FAILED, error=make_error(f"ConfigError: {exc}"),
                     allowed_from=ACTIVE, append_event=True)
        return store.status(run_id).value
    if not store.mark_started(run_id, worker_name):
        return store.status(run_id).value  # canceled before we got to it
    from workers.heartbeat import set_current_run

    set_current_run(connection, worker_name, run_id)
    status, error, summary, reported = _train(store, cfg, run_id, workdir)
    store.finish(run_id, status, error=error, summary=summary, append_event=not reported)
    return store.status(run_id).value


def _train(store: RunStore, cfg: Any, run_id: str, workdir: str | Path | None):
    """Run the engine. Returns (status, error, summary, engine_reported_run_finished)."""
    from engine.events import BatchingSink
    from engine.run import run_training  # imports torch: only in the work-horse
    from workers.sink import RedisStreamWriter

    poller = CancelPoller(store, run_id)
    sink = BatchingSink(RedisStreamWriter(store.redis, run_id, store.stream_maxlen))
    previous = os.environ.get(RUN_ENV_VAR)
    os.environ[RUN_ENV_VAR] = run_id  # marks every process of this run (see workers.reaper)
    try:
        result = run_training(cfg, sink, run_id, should_stop=poller, workdir=workdir)
        status, error, summary, reported = FROM_ENGINE[result.status], result.error, result.summary, True
    except Exception as exc:  # an engine bug or RQ's job timeout: still settle the run
        status, summary, reported = RunStatus.FAILED, None, False
        error = make_error(f"{type(exc).__name__}: {exc}", traceback.format_exc())
    finally:
        if previous is None:
            os.environ.pop(RUN_ENV_VAR, None)
        else:
            os.environ[RUN_ENV_VAR] = previous
        try:
            sink.close()
        except Exception as exc:  # the stream's tail is lost; the record still gets the end
            log.warning("run %s: event stream flush failed: %s", run_id, exc)
    if status is RunStatus.CANCELED:  # say who asked, and keep what the engine said
        said = (error or {}).get("exception")
        error = make_error(f"Canceled: {poller.reason or 'canceled'}" + (f" ({said})" if said else ""),
                           (error or {}).get("traceback"), (error or {}).get("rank"))
    return status, error, summary, reported


# -- hooks for endings RQ handles (registered by workers.worker and at enqueue) ---------------

def on_job_exception(job: Any, exc_type: type | None, exc_value: BaseException | None,
                     tb: Any) -> bool:
    """RQ exception handler: the job raised (in the horse), or RQ found it abandoned.

    Returns True so later handlers still run.
    """
    name = exc_type.__name__ if exc_type is not None else "Error"
    if name == "AbandonedJobError":
        message = "AbandonedJobError: the worker running this job stopped sending heartbeats"
    else:
        message = f"{name}: {exc_value}"
    text = "".join(traceback.format_exception(exc_type, exc_value, tb)) if tb is not None else None
    _settle(job.connection, job.id, RunStatus.FAILED, make_error(message, text))
    return True


def on_horse_killed(job: Any, retpid: int | None, ret_val: int | None, rusage: Any) -> None:
    """RQ work-horse-killed handler (in the worker process): fail the run, reap its processes."""
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
    kill_run_processes(job.id)


def on_job_stopped(job: Any, connection: redis.Redis) -> None:
    """RQ stopped callback (in the worker process, after it killed the horse on a stop-job
    command): mark the run canceled and reap any rank process that escaped the process group."""
    _settle(connection, job.id, RunStatus.CANCELED,
            make_error("Canceled: the run did not stop in time after a cancel request, so its "
                       "work-horse process group was killed"))
    kill_run_processes(job.id)


def _settle(connection: redis.Redis, run_id: str, status: RunStatus, error: dict) -> None:
    try:
        from workers.nodes import settle_node_job

        if settle_node_job(connection, run_id, status, error):  # a node job of a multi-host run
            return
        if RunStore(connection).finish(run_id, status, error=error, allowed_from=ACTIVE,
                                       append_event=True):
            log.warning("run %s: %s (%s)", run_id, status.value, error["exception"])
    except redis.RedisError as exc:
        log.error("run %s: could not record %s: %s", run_id, status.value, exc)
