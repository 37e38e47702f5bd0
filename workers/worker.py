"""The ddpviz worker: an RQ worker on queue ``ddpviz`` that runs one training run at a time.

RQ forks a work-horse per job and puts it in its own process group; the engine's DDP rank
processes are its children, so RQ's stop-job command (SIGKILL to that group) ends the whole run.
The worker process itself never imports torch.

Signals: the first SIGINT/SIGTERM asks the current run to cancel (through its cancel flag) and
exits once it has ended; a second one kills the work-horse at once (RQ's cold shutdown).
"""

from __future__ import annotations

import logging
from typing import Any

from rq import Worker
from rq.serializers import JSONSerializer

from workers import keys
from workers.connection import connect
from workers.heartbeat import Heartbeat, detect_devices
from workers.jobs import default_worker_name, on_horse_killed, on_job_exception
from workers.store import RunStore

log = logging.getLogger("ddpviz.worker")

SHUTDOWN_CANCEL_REASON = "the worker is shutting down"


class DdpvizWorker(Worker):
    """RQ's forking worker, plus: a warm shutdown cancels the running run instead of waiting
    for it to train to the end."""

    cancel_store: RunStore | None = None  # its own connection: used from a signal handler

    def handle_warm_shutdown_request(self) -> None:
        super().handle_warm_shutdown_request()
        run_id = self.get_current_job_id()
        if run_id and self.cancel_store is not None:
            try:
                self.cancel_store.request_cancel(run_id, SHUTDOWN_CANCEL_REASON)
                self.log.info("Worker %s: asked run %s to cancel", self.name, run_id)
            except Exception as exc:  # Redis gone: the run ends with the horse later
                self.log.warning("Worker %s: could not cancel run %s: %s", self.name, run_id, exc)


def _current(worker: Worker) -> tuple[str | None, str]:
    """(current run id, RQ state) without Redis round trips (read from the worker's memory)."""
    try:
        execution = next(iter(list(worker.executions.values())), None)
        state = worker.get_state()
        return (execution.job_id if execution else None), str(getattr(state, "value", state))
    except Exception:
        return None, "unknown"


def build_worker(url: str | None = None, name: str | None = None) -> DdpvizWorker:
    """An RQ worker on queue ``ddpviz`` and on its own ``ddpviz:node:{name}`` (the node jobs of
    multi-host runs, `workers.multinode`), JSON serializer, with ddpviz's failure hooks.

    Raises:
        RedisUnavailable: Redis at `url` (default `redis_url()`) cannot be reached.
    """
    name = name or default_worker_name()
    worker = DdpvizWorker(
        [keys.node_queue(name), keys.QUEUE_NAME],  # its own queue first: node jobs of multi-host runs
        connection=connect(url),
        name=name,
        serializer=JSONSerializer,
        exception_handlers=[on_job_exception],
        work_horse_killed_handler=on_horse_killed,
    )
    worker.cancel_store = RunStore(connect(url))
    return worker


def run_worker(url: str | None = None, name: str | None = None, burst: bool = False,
               *, logging_level: str = "INFO", **work_kwargs: Any) -> bool:
    """Serve queue ``ddpviz`` until stopped (or, with `burst`, until it is empty).

    A heartbeat hash (``ddpviz:worker:{name}``: host, pid, devices, ts, current run) is refreshed
    every `workers.heartbeat.HEARTBEAT_INTERVAL_S` seconds while it runs and removed on exit.

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
    worker = build_worker(url, name)
    heartbeat = Heartbeat(connect(url), worker.name, lambda: _current(worker), detect_devices())
    heartbeat.start()
    try:
        return worker.work(burst=burst, logging_level=logging_level, **work_kwargs)
    finally:
        heartbeat.stop()
