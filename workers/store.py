"""Run records in Redis: one hash per run plus an index sorted by created time.

A record's lifecycle (`RunStatus`) is ``queued → started → finished | failed | canceled``, or
``queued → canceled``, or ``started → lost`` when the worker running it stops sending heartbeats
(`workers.liveness`); a lost run whose worker turns out alive goes back to started, and its job
may still record how it really ended. Every status change is a compare-and-set (WATCH/MULTI/EXEC) so the client
(cancel), the job (start, finish) and the worker's failure hooks can race without one overwriting
another's terminal status. Changes that touch several keys (record + index, record + cancel flag
+ final event) go in one transaction.

Hash fields (all bytes; empty string = none): ``run_id``, ``status``, ``config`` (RunConfig JSON),
``created_at`` / ``started_at`` / ``finished_at`` (unix seconds), ``error`` (JSON
``{rank, exception, traceback}``), ``summary`` (JSON, see docs/events.md), ``worker``, ``group``,
``label``, ``timeout_s`` (the run's time limit), ``requeued_from`` / ``requeued_as`` (run ids
linking a re-queued run and its copy), ``pinned`` ("1": kept by retention, `workers.retention`),
``started`` (JSON: the run's ``run_started`` event — config, devices, gradient bytes, bucket
preview — kept here because the event stream is capped and a long run trims it); multi-host runs
also ``hosts`` (JSON list, one entry per node: worker, ranks, devices; `workers.jobs.nodes.host_plan`);
the runs of a DP+DDP pair also ``pair`` (JSON ``{job_id, runs, turn_steps, why}``: trained in turns
or one after the other, and why; `workers.jobs.pair`).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Callable, Iterable

import redis

from ddpviz.engine.events import make_event
from ddpviz.engine.result import ACTIVE, TERMINAL, RunStatus
from ddpviz.workers import keys
from ddpviz.workers.sink import DEFAULT_STREAM_MAXLEN, add_event

CANCEL_FLAG_TTL_S = 24 * 3600  # a cancel request outlives any sensible wait for the job to see it


# the vocabulary lives with the engine's result (`engine.result.RunStatus`); re-exported here
__all__ = ["ACTIVE", "TERMINAL", "RunStatus", "RunStore", "decode_record", "make_error", "new_run_id"]


def new_run_id() -> str:
    """A fresh run id: 16 hex digits (also the RQ job id, so letters and digits only)."""
    return uuid.uuid4().hex[:16]


def make_error(exception: str, traceback: str | None = None, rank: int | None = None,
               stage: str | None = None) -> dict:
    """An error in the engine's shape: ``{rank, exception, traceback}``, and ``stage`` when given
    (`engine.stages`)."""
    error = {"rank": rank, "exception": exception, "traceback": traceback}
    if stage is not None:
        error["stage"] = stage
    return error


def _dumps(obj: Any) -> str:
    return "" if obj is None else json.dumps(obj, default=str)


def _loads(raw: bytes | None) -> Any:
    """JSON of a stored field; None when empty or corrupt (a record edited by hand or by a bad
    client must not break the pages and commands that list runs)."""
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def _status(raw: str | None) -> str | None:
    """The stored status in today's vocabulary (a record stored as "succeeded" reads "succeeded")."""
    try:
        return RunStatus(raw).value if raw else raw
    except ValueError:
        return raw


def _float(raw: bytes | None) -> float | None:
    try:
        return float(raw) if raw else None
    except ValueError:
        return None


def decode_record(h: dict[bytes, bytes]) -> dict[str, Any] | None:
    """The public dict of a run hash (see module docstring), or None for an empty hash."""
    if not h:
        return None

    def text(name: str) -> str | None:
        raw = h.get(name.encode())
        return raw.decode() if raw else None

    return {
        "run_id": text("run_id"),
        "status": _status(text("status")),
        "config": _loads(h.get(b"config")) or {},
        "created_at": _float(h.get(b"created_at")),
        "started_at": _float(h.get(b"started_at")),
        "finished_at": _float(h.get(b"finished_at")),
        "error": _loads(h.get(b"error")),
        "summary": _loads(h.get(b"summary")),
        "worker": text("worker"),
        "group": text("group"),
        "label": text("label"),
        "timeout_s": _float(h.get(b"timeout_s")),
        "requeued_from": text("requeued_from"),
        "requeued_as": text("requeued_as"),
        "hosts": _loads(h.get(b"hosts")),  # multi-host runs: one entry per node (workers.jobs.nodes)
        "pinned": h.get(b"pinned") == b"1",  # kept whatever the retention policy (workers.retention)
        "started": _loads(h.get(b"started")),  # the run_started event (see module docstring)
        "pair": _loads(h.get(b"pair")),  # a DP+DDP pair's plan: in turns or not, and why (workers.jobs.pair)
    }


class RunStore:
    """Reads and changes run records. Thread-safe as far as the Redis client is.

    Args:
        redis: a client with ``decode_responses=False`` (see `workers.connection.connect`).
        stream_maxlen: approximate cap on events kept per run (``XADD MAXLEN ~``).
    """

    def __init__(self, redis: redis.Redis, stream_maxlen: int = DEFAULT_STREAM_MAXLEN):
        self.redis = redis
        self.stream_maxlen = stream_maxlen

    # -- create and read ------------------------------------------------------------------

    def create(self, run_id: str, config: dict[str, Any], *, label: str | None = None,
               group: str | None = None, timeout_s: float | None = None,
               requeued_from: str | None = None, pair: dict | None = None,
               pipeline: Any = None) -> None:
        """Store a new record with status queued and index it by created time.

        Args:
            pair: for a run of a DP+DDP pair, ``{job_id, runs: [dp, ddp], turn_steps, why}``
                (`workers.jobs.pair.pair_plan`).
            timeout_s: the run's time limit in seconds (see `workers.jobs.run`); None = the default.
            requeued_from: the run this one re-queues.
            pipeline: a transaction to add the commands to (the caller executes it); when None
                they run in a transaction of their own.
        """
        now = time.time()
        mapping = {"run_id": run_id, "status": RunStatus.QUEUED.value, "config": _dumps(config),
                   "created_at": repr(now), "started_at": "", "finished_at": "", "error": "",
                   "summary": "", "worker": "", "group": group or "", "label": label or "",
                   "timeout_s": "" if timeout_s is None else repr(float(timeout_s)),
                   "requeued_from": requeued_from or "", "requeued_as": ""}
        if pair is not None:
            mapping["pair"] = _dumps(pair)
        pipe = pipeline if pipeline is not None else self.redis.pipeline(transaction=True)
        pipe.hset(keys.run(run_id), mapping=mapping)
        pipe.zadd(keys.RUNS, {run_id: now})
        if pipeline is None:
            pipe.execute()

    def save_started(self, run_id: str, event: dict[str, Any]) -> None:
        """Keep the run's ``run_started`` event in its record (the stream's copy may be trimmed)."""
        self.redis.hset(keys.run(run_id), "started", _dumps(event))

    def exists(self, run_id: str) -> bool:
        return bool(self.redis.exists(keys.run(run_id)))

    def get(self, run_id: str) -> dict[str, Any] | None:
        """The record of `run_id`, or None if there is none."""
        return decode_record(self.redis.hgetall(keys.run(run_id)))

    def status(self, run_id: str) -> RunStatus | None:
        raw = self.redis.hget(keys.run(run_id), "status")
        return RunStatus(raw.decode()) if raw else None

    def list(self, limit: int = 100) -> list[dict[str, Any]]:
        """The `limit` most recently created records, newest first."""
        if limit <= 0:
            return []
        ids = self.redis.zrevrange(keys.RUNS, 0, limit - 1)
        pipe = self.redis.pipeline(transaction=False)
        for rid in ids:
            pipe.hgetall(keys.run(rid.decode()))
        return [r for r in map(decode_record, pipe.execute() if ids else []) if r is not None]

    # -- status changes ---------------------------------------------------------------------

    def transition(self, run_id: str, to: RunStatus, *, allowed_from: Iterable[RunStatus],
                   fields: dict[str, str] | None = None,
                   also: Callable[[Any], None] | None = None) -> bool:
        """Set status `to` (and `fields`) only if the current status is in `allowed_from`.

        Args:
            also: adds more commands to the same transaction (called with the pipeline).

        Returns:
            True if the change was made; False if the record is missing or in another status.
        """
        key = keys.run(run_id)
        allowed = {RunStatus(s).value for s in allowed_from}
        with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(key)
                    current = pipe.hget(key, "status")
                    if current is None or current.decode() not in allowed:
                        pipe.unwatch()
                        return False
                    pipe.multi()
                    pipe.hset(key, mapping={"status": RunStatus(to).value, **(fields or {})})
                    if also is not None:
                        also(pipe)
                    pipe.execute()
                    return True
                except redis.WatchError:
                    continue  # someone changed the record between WATCH and EXEC: re-check

    def mark_started(self, run_id: str, worker: str) -> bool:
        """queued → started, recording the worker and started_at. False if no longer queued
        (e.g. canceled before the worker got to it)."""
        return self.transition(run_id, RunStatus.STARTED, allowed_from=[RunStatus.QUEUED],
                               fields={"worker": worker, "started_at": repr(time.time())},
                               also=lambda pipe: pipe.sadd(keys.STARTED, run_id))

    def started_runs(self) -> list[str]:
        """Ids of the runs indexed as started (the lost-run monitor's worklist)."""
        return sorted(r.decode() for r in self.redis.smembers(keys.STARTED))

    def mark_lost(self, run_id: str, error: dict) -> bool:
        """started → lost, with a ``run_finished`` event (status ``lost``). False if not started."""
        return self.finish(run_id, RunStatus.LOST, error=error, append_event=True)

    def revive(self, run_id: str, worker: str) -> bool:
        """lost → started: the worker judged lost is alive and still running the run."""
        def also(pipe: Any) -> None:
            pipe.sadd(keys.STARTED, run_id)
            add_event(pipe, run_id, make_event("log", run_id, level="warning", message=(
                f"worker {worker} is alive after all: the run was not lost and goes on")),
                self.stream_maxlen)

        return self.transition(run_id, RunStatus.STARTED, allowed_from=[RunStatus.LOST],
                               fields={"finished_at": "", "error": ""}, also=also)

    def finish(self, run_id: str, status: RunStatus, *, error: dict | None = None,
               summary: dict | None = None, allowed_from: Iterable[RunStatus] = (RunStatus.STARTED,),
               append_event: bool = False, clear_cancel_flag: bool = True) -> bool:
        """Record a terminal `status` with its error and summary, clearing any cancel flag.

        Args:
            allowed_from: statuses the change may start from (default started only, so a run
                already finished, failed or canceled keeps its first terminal status).
            append_event: also append a ``run_finished`` event to the run's stream, in the same
                transaction — for endings the engine could not report itself (canceled while
                queued, work-horse killed).
            clear_cancel_flag: delete the run's cancel flag (keep it when the run may still be
                running, so it stops as soon as it looks).

        Returns:
            True if this call set the terminal status.
        """
        if status not in TERMINAL:
            raise ValueError(f"status must be one of {[s.value for s in TERMINAL]} (got {status!r})")
        fields = {"finished_at": repr(time.time()), "error": _dumps(error)}
        if summary is not None:
            fields["summary"] = _dumps(summary)

        def also(pipe: Any) -> None:
            pipe.srem(keys.STARTED, run_id)
            if clear_cancel_flag:
                pipe.delete(keys.cancel(run_id))
            if append_event:
                event = make_event("run_finished", run_id, status=RunStatus(status).value, error=error,
                                   summary=summary or {})
                add_event(pipe, run_id, event, self.stream_maxlen)

        return self.transition(run_id, status, allowed_from=allowed_from, fields=fields, also=also)

    # -- cancel flag ------------------------------------------------------------------------

    def request_cancel(self, run_id: str, reason: str = "canceled by user") -> None:
        """Set the cancel flag that the running job polls (expires after `CANCEL_FLAG_TTL_S`)."""
        self.redis.set(keys.cancel(run_id), reason.encode(), ex=CANCEL_FLAG_TTL_S)

    def cancel_reason(self, run_id: str) -> str | None:
        """The reason given with a pending cancel request, or None if none is pending."""
        raw = self.redis.get(keys.cancel(run_id))
        return raw.decode() if raw is not None else None
