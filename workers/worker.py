"""The ddpviz worker: an RQ worker on queue ``ddpviz`` that runs one training run at a time.

RQ forks a work-horse per job and puts it in its own process group; the engine's DDP rank
processes are its children, so RQ's stop-job command (SIGKILL to that group) ends the whole run.
The worker process itself never imports torch.

Signals: the first SIGINT/SIGTERM asks the current run to cancel (through its cancel flag) and
exits once it has ended; a second one kills the work-horse at once (RQ's cold shutdown). A worker
killed outright (SIGKILL) takes its work-horse with it (a parent-death signal, set as the horse
starts), and the horse takes the rank processes (theirs); the run is then marked lost
(`workers.liveness`).

Hardening over RQ's worker: only ddpviz's job functions run (`DdpvizJob`); a job hash RQ cannot
even read is refused and removed instead of stopping the worker; Redis going away while a job runs
(a restart) is logged and ridden out instead of ending the worker.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from typing import Any

import redis
from rq import Worker
from rq.exceptions import DeserializationError
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job
from rq.serializers import JSONSerializer

from ddpviz.engine.components.lifetime import die_with_parent, is_live_child
from ddpviz.workers import keys
from ddpviz.workers.connection import WORKER_RETRY_ATTEMPTS, WORKER_RETRY_BACKOFF_CAP_S, connect, exposure_warning, redis_url
from ddpviz.workers.heartbeat import Heartbeat, detect_devices
from ddpviz.workers.host.gpus import GpuMonitor
from ddpviz.workers.jobs.run import JobRefused, allowed_job_funcs, default_worker_name, on_horse_killed, on_job_exception
from ddpviz.workers.liveness import LostRunMonitor
from ddpviz.workers.store import ACTIVE, RunStatus, RunStore, make_error

log = logging.getLogger("ddpviz.worker")
# `kill -USR1 PID` makes a worker, or its work-horse (which inherits it), write every thread's
# stack to its stderr (faulthandler): what a worker that seems stuck is doing, without stopping it.
STACKS_SIGNAL = signal.SIGUSR1
PUBSUB_STOP_WAIT_S = 1.0  # how long a stopping worker waits for RQ's command-channel thread

SHUTDOWN_CANCEL_REASON = "the worker is shutting down"
# after asking its run to cancel, a stopping worker stops the horse itself if it still runs this long after (a run
# stops within a few seconds of a cancel it can read: `workers.host.stop`)
SHUTDOWN_KILL_AFTER_S = 20.0
_REDIS_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


def vet_job(job: Job) -> None:
    """Refuse a job ddpviz did not enqueue: its data must be the JSON ``[func, instance, args,
    kwargs]`` of one of `workers.jobs.run.ALLOWED_JOB_FUNCS` (never unpickled, never imported
    otherwise).

    Raises:
        JobRefused: naming the field at fault (data, func, instance, args, kwargs).
    """
    try:
        shape = json.loads(job.data)
        if not (isinstance(shape, list) and len(shape) == 4):
            raise ValueError("not a list of 4")
        name, instance = job.func_name, job._instance
    except (ValueError, TypeError, DeserializationError):
        raise JobRefused("job payload: data is not the JSON [func, instance, args, kwargs] "
                         "that ddpviz enqueues") from None
    if not isinstance(name, str) or name not in allowed_job_funcs():
        raise JobRefused(f"job payload: func {str(name)[:80]!r} is not a ddpviz job "
                         f"(allowed: {sorted(allowed_job_funcs())})")
    if instance is not None:
        raise JobRefused("job payload: instance must be null")
    if not isinstance(job.args, (list, tuple)) or not isinstance(job.kwargs, dict):
        raise JobRefused("job payload: args must be a list and kwargs an object")


class DdpvizJob(Job):
    """An RQ job that runs only ddpviz's job functions (`vet_job`), checked in the work-horse
    before the function is imported or called: a payload naming any other function
    (``os.system``, ``builtins.eval``) is refused, never executed."""

    def _execute(self) -> Any:
        vet_job(self)
        return super()._execute()

    @property
    def func(self) -> Any:
        """The job's function, by its name; a name an earlier release queued
        (`workers.jobs.run.LEGACY_JOB_FUNCS`) resolves to the function it names now."""
        from rq.utils import import_attribute

        from ddpviz.workers.jobs.run import LEGACY_JOB_FUNCS

        name = self.func_name
        return None if name is None else import_attribute(LEGACY_JOB_FUNCS.get(name, name))


def unreadable_field(raw: dict[bytes, bytes]) -> str:
    """The first field of a raw RQ job hash that RQ cannot parse (``data`` when missing)."""
    from rq.job import JobStatus
    from rq.utils import parse_timeout, str_to_date

    if b"data" not in raw:
        return "data"
    checks = {"created_at": str_to_date, "enqueued_at": str_to_date, "started_at": str_to_date,
              "ended_at": str_to_date, "last_heartbeat": str_to_date,
              "timeout": lambda v: parse_timeout(v.decode()), "status": lambda v: JobStatus(v.decode()),
              "dependency_ids": json.loads, "result_ttl": int, "failure_ttl": int}
    for name, check in checks.items():
        value = raw.get(name.encode())
        if value:
            try:
                check(value)
            except Exception:
                return name
    return "job hash"


class DdpvizWorker(Worker):
    """RQ's forking worker, plus: a warm shutdown cancels the running run instead of waiting
    for it to train to the end; the hardening listed in the module docstring."""

    cancel_store: RunStore | None = None  # its own connection: used from a signal handler
    job_class = DdpvizJob

    # -- the work-horse dies with the worker -------------------------------------------------

    def main_work_horse(self, job: Any, queue: Any) -> None:
        die_with_parent(self.pid)  # self.pid is the worker's: set before the fork
        super().main_work_horse(job, queue)

    # -- malformed jobs are refused, not fatal -----------------------------------------------

    def prepare_job_execution(self, job: Any, remove_from_intermediate_queue: bool = False) -> None:
        vet_job(job)  # in the horse, before RQ itself reads the payload (it names the function)
        super().prepare_job_execution(job, remove_from_intermediate_queue)

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None):
        while True:
            try:
                return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
            except Exception as exc:
                job_id = getattr(exc, "job_id", None)
                if job_id is None:
                    raise
                self.refuse_unreadable_job(job_id, getattr(exc, "queue", None), exc)

    def refuse_unreadable_job(self, job_id: str, queue: Any, exc: BaseException) -> None:
        """Drop a job hash RQ cannot parse; fail its run, if it names one that is still active."""
        try:
            field = unreadable_field(self.connection.hgetall(Job.key_for(job_id)))
        except Exception:
            field = "?"
        message = (f"JobRefused: job payload: field {field!r} of the job hash cannot be read "
                   f"({type(exc).__name__}: {str(exc)[:200]})")
        self.log.warning("Worker %s: refused job %r: %s", self.name, str(job_id)[:80], message)
        with contextlib.suppress(Exception):
            pipe = self.connection.pipeline(transaction=True)
            if queue is not None:
                pipe.lrem(IntermediateQueue.get_intermediate_queue_key(queue.key), 1, job_id)
            pipe.delete(Job.key_for(job_id))
            pipe.execute()
        with contextlib.suppress(Exception):
            RunStore(self.connection).finish(job_id, RunStatus.FAILED, error=make_error(message),
                                             allowed_from=ACTIVE, append_event=True)

    # -- shutdown is bounded -----------------------------------------------------------------

    def unsubscribe(self) -> None:
        """RQ's `unsubscribe` (end the command channel's pubsub thread), with the wait bounded.

        RQ runs that thread with ``sleep_time=60`` and, on exit, unsubscribes and then calls the
        thread's `stop()`. Since redis-py 8.2, `stop()` joins the thread without a bound, and a
        thread that handled the unsubscribe reply before `stop()` cleared its flag waits in
        `get_message` for a subscription, up to 60 s: a worker leaving burst mode or a SIGTERM
        hung that long (seen in `make test`: every thread's stack at 30 s showed
        `PubSubWorkerThread.stop` joining a thread waiting in `get_message`). The thread is a
        daemon and reads nothing once unsubscribed, so it is left to end with the process.
        """
        thread = self.pubsub_thread
        if not thread:
            return
        self.log.info("Worker %s: unsubscribing from channel %s", self.name, self.pubsub_channel_name)
        with contextlib.suppress(Exception):
            self.pubsub.unsubscribe()
        try:
            thread.stop(timeout=PUBSUB_STOP_WAIT_S)
        except TypeError:  # redis-py < 8.2: stop() takes no timeout and does not wait
            thread.stop()
        thread.join(timeout=PUBSUB_STOP_WAIT_S)
        with contextlib.suppress(Exception):
            self.pubsub.close()

    # -- Redis restarts are ridden out -------------------------------------------------------

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        try:
            super().heartbeat(timeout, pipeline)
        except _REDIS_DOWN as exc:
            self.log.warning("Worker %s: heartbeat to Redis failed (%s); retrying later", self.name, exc)

    def maintain_heartbeats(self, job: Any, execution: Any) -> None:
        try:
            super().maintain_heartbeats(job, execution)
        except _REDIS_DOWN as exc:
            self.log.warning("Worker %s: job heartbeat failed (%s); retrying later", self.name, exc)

    def run_maintenance_tasks(self) -> None:
        try:
            super().run_maintenance_tasks()
        except _REDIS_DOWN as exc:
            self.log.warning("Worker %s: maintenance skipped (%s)", self.name, exc)

    def check_for_suspension(self, burst: bool) -> None:
        try:
            super().check_for_suspension(burst)
        except _REDIS_DOWN as exc:
            self.log.warning("Worker %s: cannot check for suspension (%s)", self.name, exc)

    def execute_job(self, job: Any, queue: Any) -> None:
        try:
            super().execute_job(job, queue)
        except _REDIS_DOWN as exc:  # the horse records its run's end itself, with retries
            self.log.error("Worker %s: lost Redis while running job %s (%s); going on",
                           self.name, job.id, exc)
            if self.horse_pid:
                self.wait_for_horse()
                self._horse_pid = 0

    def handle_warm_shutdown_request(self) -> None:
        super().handle_warm_shutdown_request()
        job_id = self.get_current_job_id()
        if not job_id or self.cancel_store is None:
            return
        from ddpviz.workers.keys import pair_or_run

        unasked = []
        for run_id in pair_or_run(job_id):  # both runs of a pair job
            try:
                self.cancel_store.request_cancel(run_id, SHUTDOWN_CANCEL_REASON)
                self.log.info("Worker %s: asked run %s to cancel", self.name, run_id)
            except Exception as exc:  # Redis gone (`up` killed with it, say): the run cannot hear a cancel
                self.log.warning("Worker %s: could not cancel run %s: %s", self.name, run_id, exc)
                unasked.append(run_id)
        if not unasked and self.horse_pid:  # asked; a horse that cannot hear it (Redis gone right after) is stopped
            timer = threading.Timer(SHUTDOWN_KILL_AFTER_S, self._stop_horse_still_running, args=(self.horse_pid,))
            timer.daemon = True
            timer.start()
        if unasked and self.horse_pid:
            # its ranks would train on, unasked, while the horse retries recording its end for minutes: a new user's
            # `kill -9` of `up` left a worker, its horse and two ranks training for ~8 minutes (2026-12-06). The
            # horse's process group goes now (its ranks with it, by their parent-death signal); the run is judged
            # lost once Redis is back (`workers.liveness`), with nothing of it left running
            self.log.warning("Worker %s: stopping run(s) %s now, with no Redis to cancel them through", self.name,
                             ", ".join(unasked))
            self.kill_horse()


    def _stop_horse_still_running(self, pid: int) -> None:
        """`SHUTDOWN_KILL_AFTER_S` after a warm shutdown asked the run to cancel: the same horse still running
        could not hear it (`kill -9` of `up` takes its Redis a moment after the worker wrote the cancel; the horse's
        poller then reads no flag and its ranks trained on for ~8 minutes, a new user, 2026-12-06): stop it."""
        if self.horse_pid != pid or not is_live_child(pid):  # ended (and reaped: its pid may be anyone's now)
            return
        self.log.warning("Worker %s: the run did not stop %.0f s after its cancel; stopping its processes",
                         self.name, SHUTDOWN_KILL_AFTER_S)
        with contextlib.suppress(Exception):
            self.kill_horse()
        # a stopping worker whose Redis is gone retries every call into it for ~20 s (WORKER_RETRY_ATTEMPTS) and
        # stayed, idle, for minutes (parent 1, after `kill -9` of `up`): with nothing left to record, it goes
        time.sleep(SHUTDOWN_KILL_AFTER_S)
        try:
            self.connection.ping()
        except Exception:
            self.log.warning("Worker %s: stopping, and Redis still unreachable: exiting", self.name)
            os._exit(1)


def _current(worker: Worker) -> tuple[str | None, str]:
    """(current run id, RQ state) without Redis round trips (read from the worker's memory); a
    pair job (`workers.jobs.pair`) runs two runs at once, named ``"dp,ddp"``."""
    try:
        execution = next(iter(list(worker.executions.values())), None)
        state = worker.get_state()
        job_id = execution.job_id if execution else None
        # a multi-host run's node job names its run; a pair job both its runs, "dp,ddp"
        return (",".join(keys.job_run_ids(job_id)) if job_id else None), str(getattr(state, "value", state))
    except Exception:
        return None, "unknown"


def build_worker(url: str | None = None, name: str | None = None) -> DdpvizWorker:
    """An RQ worker on queue ``ddpviz`` and on its own ``ddpviz:node:{name}`` (the node jobs of
    multi-host runs, `workers.jobs.multinode`), JSON serializer, with ddpviz's failure hooks.

    Raises:
        RedisUnavailable: Redis at `url` (default `redis_url()`) cannot be reached.
    """
    name = name or default_worker_name()
    worker = DdpvizWorker(
        [keys.node_queue(name), keys.QUEUE_NAME],  # its own queue first: node jobs of multi-host runs
        connection=connect(url, retry_attempts=WORKER_RETRY_ATTEMPTS,
                           retry_cap_s=WORKER_RETRY_BACKOFF_CAP_S),
        name=name,
        serializer=JSONSerializer,
        exception_handlers=[on_job_exception],
        work_horse_killed_handler=on_horse_killed,
    )
    worker.cancel_store = RunStore(connect(url))
    return worker


def warm_up() -> None:
    """Import the engine (torch with it) once, in the worker, before it takes a job.

    RQ forks a work-horse per job, which inherits these modules: without this, each job imports
    torch itself (~3 s here, tens of seconds on a busy host), inside the run's time limit and
    before its cancel is watched. Importing torch starts no CUDA context, so forking after it is
    safe (PyTorch's multiprocessing notes); the engine's rank processes come from its fork server.
    """
    import ddpviz.engine.runner  # noqa: F401
    from ddpviz import engine  # noqa: E402


def run_worker(url: str | None = None, name: str | None = None, burst: bool = False,
               *, logging_level: str = "INFO", **work_kwargs: Any) -> bool:
    """Serve queue ``ddpviz`` until stopped (or, with `burst`, until it is empty).

    A heartbeat hash (``ddpviz:worker:{name}``: host, pid, devices, ts, current run) is refreshed
    every `workers.heartbeat.HEARTBEAT_INTERVAL_S` seconds while it runs and removed on exit.
    SIGUSR1 (`STACKS_SIGNAL`) writes every thread's stack to stderr and the worker goes on.

    Args:
        url: Redis URL; default `workers.connection.redis_url()`.
        name: worker name, unique among live workers; default ``host-pid``.
        burst: quit when the queue is empty instead of waiting for jobs.
        work_kwargs: passed to `rq.Worker.work` (e.g. ``max_jobs``).

    Returns:
        True if at least one job was run.

    Raises:
        RedisUnavailable: Redis cannot be reached.
        ValueError: another live worker already has this name (from RQ).
    """
    import faulthandler

    faulthandler.register(STACKS_SIGNAL, all_threads=True)
    warning = exposure_warning(url or redis_url())
    if warning:
        log.warning("ddpviz worker: %s", warning)
    worker = build_worker(url, name)
    beat_client = connect(url)
    monitor = LostRunMonitor(RunStore(beat_client), worker.name, lambda: _current(worker)[0])
    heartbeat = Heartbeat(beat_client, worker.name, lambda: _current(worker), detect_devices(),
                          gpus=GpuMonitor(), monitor=monitor.maybe_sweep)
    heartbeat.start()
    from ddpviz.workers.retention import retain_quietly

    retain_quietly(beat_client, worker.name)
    warm_up()
    try:
        return worker.work(burst=burst, logging_level=logging_level, **work_kwargs)
    finally:
        heartbeat.stop()
