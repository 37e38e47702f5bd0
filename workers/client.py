"""The API the app and the CLI use to submit, watch and cancel runs. Imports no torch.

Example:
    >>> client = DdpvizClient(url="redis://127.0.0.1:6379/0")
    >>> dp_id, ddp_id = client.submit_pair({"world_size": 2, "steps": 50})
    >>> events, last_id = client.read_events(ddp_id)          # everything so far
    >>> more, last_id = client.read_events(ddp_id, last_id)   # only what came since
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import redis
from rq import Queue
from rq.command import send_stop_job_command
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer

from ddpviz.engine.config import COMM_HOOK_FIELDS, validate_config
from ddpviz.workers import keys
from ddpviz.workers.connection import connect
from ddpviz.workers.heartbeat import read_workers
from ddpviz.workers.jobs.pair import pair_plan
from ddpviz.workers.jobs.run import JOB_FUNC, JOB_TIMEOUT_S, PAIR_JOB_FUNC, STOPPED_CALLBACK, rq_job_timeout
from ddpviz.workers.liveness import check_records
from ddpviz.workers.sink import decode_entries
from ddpviz.workers.store import ACTIVE, TERMINAL, RunStatus, RunStore, make_error, new_run_id
from ddpviz.workers.sweeps import member_label

MAX_LABEL_CHARS = 80  # a label given to submit or submit_pair (a pair's runs add " · DP")


def check_label(label: str | None) -> None:
    """Raises engine.config.ConfigError (field ``label``) for a label over `MAX_LABEL_CHARS`: a 300-character
    label widened `ddpviz runs` and every picker (a new user, 2026-12-06)."""
    if label and len(label) > MAX_LABEL_CHARS:
        from ddpviz.engine.config import ConfigError

        raise ConfigError([("label", f"label must be at most {MAX_LABEL_CHARS} characters (got {len(label)})")])

CANCEL_WAIT_S = 3.0  # how long a started run gets to stop by itself before its horse is killed
CANCEL_POLL_S = 0.1
RESULT_TTL_S = 24 * 3600  # RQ keeps a job's result this long (the run record is kept forever)
FAILURE_TTL_S = 7 * 24 * 3600


class DdpvizClient:
    """Submit, watch and cancel ddpviz runs through Redis.

    Args:
        redis: a client with ``decode_responses=False``; when None, one is made from `url`.
        url: Redis URL (default ``$REDIS_URL``, see `workers.connection.redis_url`).

    Raises:
        RedisUnavailable: when connecting from `url` and Redis does not answer.
    """

    def __init__(self, redis: redis.Redis | None = None, url: str | None = None, **connect_kwargs: Any):
        """`redis`: a client to use; else one to `url` (`workers.connection.connect`, with `connect_kwargs`:
        the CLI passes its short reply timeout)."""
        self.redis = redis if redis is not None else connect(url, **connect_kwargs)
        self.store = RunStore(self.redis)
        self.queue = Queue(keys.QUEUE_NAME, connection=self.redis, serializer=JSONSerializer)

    # -- submitting -------------------------------------------------------------------------

    def submit(self, config: dict[str, Any], *, label: str | None = None,
               group: str | None = None, timeout_s: float | None = None) -> str:
        """Validate `config`, store the run as queued and enqueue it. Returns the run id.

        Args:
            timeout_s: the run's time limit in seconds, from its start (default
                `workers.jobs.run.JOB_TIMEOUT_S`); past it every process of the run is stopped and
                the run is failed with ``JobTimeout``.

        Raises:
            engine.config.ConfigError: a field breaks a rule (the message names the field);
                for ``nnodes > 1``, also fewer idle workers than nnodes.
        """
        cfg = validate_config(config)
        check_label(label)
        if cfg.nnodes > 1:  # one node job per host (workers.jobs.multinode)
            from ddpviz.workers.jobs.multinode import submit_multinode

            return submit_multinode(self.redis, cfg.to_json_dict(), label=label, group=group)
        return self._submit_many([(config, label)], group, timeout_s=timeout_s)[0]

    def submit_pair(self, config: dict[str, Any], *, label: str | None = None,
                    timeout_s: float | None = None) -> tuple[str, str]:
        """Submit `config` twice, as mode=dp (without the DDP-only comm hook fields) and mode=ddp,
        sharing a group id (and the time limit `timeout_s`, see `submit`), as one job
        (`workers.jobs.pair.execute_pair`) that trains both at once on one worker, taking turns of
        `engine.measure.turns.pair_turn_steps(steps)` steps (the order swapped each round), so the
        verdict compares the modes at the same moments of the machine. Steps no turn size divides
        (e.g. 7) still run, one after the other in that job; both records' ``pair`` field and the
        runs' first event say which and why. Each run keeps its own record, events, status,
        summary and `cancel`. Both are validated before either is stored.

        Each run's time limit counts from its start, so in turns it includes the other run's turns.

        Args:
            label: the pair's name; the runs are labelled ``"{label} · DP"`` and
                ``"{label} · DDP"`` (`member_label`), or "DP" and "DDP" without one.

        Returns:
            (dp_run_id, ddp_run_id).

        Raises:
            engine.config.ConfigError: either variant breaks a rule (naming the field).
        """
        check_label(label)
        dp_config = {k: v for k, v in config.items() if k not in COMM_HOOK_FIELDS}
        dp, ddp = self._submit_many([({**dp_config, "mode": "dp"}, member_label(label, "DP")),
                                     ({**config, "mode": "ddp"}, member_label(label, "DDP"))],
                                    uuid.uuid4().hex[:12], timeout_s=timeout_s, as_pair=True)
        return dp, ddp

    def _submit_many(self, items: list[tuple[dict[str, Any], str | None]], group: str | None, *,
                     timeout_s: float | None = None, requeued_from: str | None = None,
                     as_pair: bool = False) -> list[str]:
        if timeout_s is not None and not 0 < timeout_s <= 30 * 24 * 3600:
            from ddpviz.engine.config import ConfigError

            raise ConfigError([("timeout_s", f"timeout_s must be > 0 and <= 30 days (got {timeout_s})")])
        configs = [validate_config(cfg).to_json_dict() for cfg, _ in items]
        run_ids = [new_run_id() for _ in items]
        pair = pair_plan(run_ids[0], run_ids[1], configs[1]["steps"], configs[1].get("nnodes", 1)) if as_pair else None
        with self.redis.pipeline(transaction=True) as pipe:  # records and jobs appear together
            pipe.multi()  # explicit MULTI, as RQ expects of a caller's pipeline
            for run_id, cfg, (_, label) in zip(run_ids, configs, items):
                self.store.create(run_id, cfg, label=label, group=group, timeout_s=timeout_s,
                                  requeued_from=requeued_from, pair=pair, pipeline=pipe)
            jobs = [(JOB_FUNC, [r], r, f"ddpviz run {r} ({c['mode']})", timeout_s)
                    for r, c in zip(run_ids, configs)]
            if pair is not None:  # one job; in turns both runs' limits pass at once, else one after the other
                jobs = [(PAIR_JOB_FUNC, run_ids, pair["job_id"], f"ddpviz pair {' + '.join(run_ids)} (dp, ddp)",
                         2 * (timeout_s or JOB_TIMEOUT_S))]
            for func, args, job_id, description, limit_s in jobs:
                self.queue.enqueue(func, args=args, job_id=job_id, job_timeout=rq_job_timeout(limit_s),
                                   result_ttl=RESULT_TTL_S, failure_ttl=FAILURE_TTL_S,
                                   description=description, on_stopped=STOPPED_CALLBACK, pipeline=pipe)
            pipe.execute()
        return run_ids

    # -- reading ----------------------------------------------------------------------------

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        """The run's record: ``{run_id, status, config, created_at, started_at, finished_at,
        error, summary, worker, group, label, timeout_s, requeued_from, requeued_as}`` (times in
        unix seconds, None when not yet), or None if there is no such run.

        A started run whose worker stopped sending heartbeats is marked ``lost`` here (see
        `workers.liveness`)."""
        return check_records(self.store, [self.store.get(run_id)])[0]

    def list_runs(self, limit: int = 100) -> list[dict[str, Any]]:
        """The `limit` most recent runs, newest first (same dicts as `get_run`)."""
        return check_records(self.store, self.store.list(limit))

    def requeue(self, run_id: str) -> str:
        """Submit an ended run again (same config, label and time limit) as a new run, e.g. after
        its worker was lost. Returns the new run's id; the old record gets ``requeued_as``.

        Raises:
            KeyError: there is no run `run_id`.
            ValueError: the run is still queued or started (cancel it first).
            engine.config.ConfigError: its config no longer validates (a plugin model gone).
        """
        record = self.get_run(run_id)
        if record is None:
            raise KeyError(f"no run {run_id!r}")
        if record["status"] in {s.value for s in ACTIVE}:
            raise ValueError(f"run {run_id} is {record['status']}; only an ended run can be "
                             f"re-queued (cancel it first)")
        if (record["config"] or {}).get("nnodes", 1) > 1:  # placed on hosts again
            new_id = self.submit(record["config"], label=record["label"])
            self.redis.hset(keys.run(new_id), "requeued_from", run_id)
        else:
            (new_id,) = self._submit_many([(record["config"], record["label"])], None,
                                          timeout_s=record.get("timeout_s"), requeued_from=run_id)
        self.redis.hset(keys.run(run_id), "requeued_as", new_id)
        return new_id

    def read_events(self, run_id: str, after_id: str = "0-0",
                    count: int = 2000) -> tuple[list[dict[str, Any]], str]:
        """Up to `count` events stored after stream id `after_id` (exclusive), oldest first.

        Returns:
            (events, last_id): last_id is the id of the last event returned, or `after_id`
            unchanged when there is nothing new; pass it back to read on.
        """
        entries = self.redis.xrange(keys.events(run_id), min=f"({after_id}", max="+", count=count)
        if not entries:
            return [], after_id
        return decode_entries(entries), entries[-1][0].decode()

    def read_tail(self, run_id: str, after_id: str = "0-0",
                  count: int = 2000) -> tuple[list[dict[str, Any]], str]:
        """The newest `count` events stored after stream id `after_id` (exclusive), oldest first:
        one XREVRANGE, however long the stream (the app opens long runs with it).

        Returns:
            (events, last_id): last_id is the id of the newest event, or `after_id` when there
            is nothing after it.
        """
        entries = self.redis.xrevrange(keys.events(run_id), max="+", min=f"({after_id}", count=count)
        if not entries:
            return [], after_id
        return decode_entries(entries[::-1]), entries[0][0].decode()

    def tail_events(self, run_id: str, count: int) -> list[dict[str, Any]]:
        """The last `count` events of the run, oldest first."""
        if count <= 0:
            return []
        entries = self.redis.xrevrange(keys.events(run_id), max="+", min="-", count=count)
        return decode_entries(entries[::-1])

    # -- retention --------------------------------------------------------------------------

    def pin(self, run_id: str, pinned: bool = True) -> bool:
        """Pin a run (retention never deletes it) or unpin it. False if there is no such run."""
        from ddpviz.workers.retention import set_pinned

        return set_pinned(self.redis, run_id, pinned)

    def retention_policy(self) -> dict[str, Any] | None:
        """The policy workers last published: {keep_runs, keep_days, worker, ts, text}, or None
        when no worker has (see `workers.retention`)."""
        from ddpviz.workers.retention import read_policy

        return read_policy(self.redis)

    # -- cancelling -------------------------------------------------------------------------

    def cancel(self, run_id: str, reason: str = "canceled by user") -> str:
        """Cancel the run and return its resulting status.

        A queued run is dequeued and marked canceled at once (with a ``run_finished`` event).
        A started run gets its cancel flag set, which the engine polls; if it has not ended
        within `CANCEL_WAIT_S` seconds its work-horse process group (which holds the DDP rank
        processes) is killed through RQ's stop-job command and the run is marked canceled with
        an explanatory error. A run of a pair whose other run is still active only gets its
        flag and that record: the pair's job (`workers.jobs.pair`) skips it, or kills its
        processes alone, and the other run trains on. Runs already ended keep their status.

        Raises:
            KeyError: there is no run `run_id`.
        """
        status = self.store.status(run_id)
        if status is None:
            raise KeyError(f"no run {run_id!r}")
        if status is RunStatus.QUEUED:
            if self.store.finish(run_id, RunStatus.CANCELED,
                                 error=make_error(f"Canceled: {reason} (while queued)"),
                                 allowed_from=[RunStatus.QUEUED], append_event=True):
                self._cancel_rq_job(run_id)
                return RunStatus.CANCELED.value
            status = self.store.status(run_id)  # a worker took it meanwhile
        if status is RunStatus.STARTED:
            return self._cancel_started(run_id, reason)
        return status.value

    def _pair_partner_active(self, run_id: str) -> bool:
        """True when `run_id` shares a pair job (`workers.jobs.pair`) with a run still queued or
        started: that job must go on for the partner, so it is neither canceled nor stopped."""
        record = self.store.get(run_id) or {}
        pair = record.get("pair") or {}
        if not pair.get("job_id"):
            return False
        others = [r for r in pair.get("runs") or [] if r != run_id]
        return any(self.store.status(r) in ACTIVE for r in others)

    def _cancel_rq_job(self, run_id: str) -> None:
        from ddpviz.workers.jobs.multinode import rq_job_ids  # a multi-host run has one job per host

        if self._pair_partner_active(run_id):
            return  # the pair's job skips a run no longer queued (run_job) and trains the other alone
        for job_id in rq_job_ids(self.redis, run_id):
            try:
                Job.fetch(job_id, connection=self.redis, serializer=JSONSerializer).cancel()
            except (NoSuchJobError, InvalidJobOperation):
                pass  # already gone or canceled; the worker skips runs that are not queued anyway

    def _cancel_started(self, run_id: str, reason: str) -> str:
        self.store.request_cancel(run_id, reason)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while time.monotonic() < deadline:
            status = self.store.status(run_id)
            if status in TERMINAL:
                return status.value
            time.sleep(CANCEL_POLL_S)
        if self._pair_partner_active(run_id):  # stopping the pair's job would end the other run too
            self.store.finish(run_id, RunStatus.CANCELED, append_event=True, clear_cancel_flag=False,
                              error=make_error(
                f"Canceled: {reason}; the run did not stop within {CANCEL_WAIT_S:g} s, so the pair's job "
                f"kills its processes (the other run of the pair trains on)"))
            return self.store.status(run_id).value
        from ddpviz.workers.jobs.multinode import rq_job_ids  # a multi-host run has one job per host

        for job_id in rq_job_ids(self.redis, run_id):
            try:
                send_stop_job_command(self.redis, job_id, serializer=JSONSerializer)
            except (NoSuchJobError, InvalidJobOperation):
                pass  # the job ended or has no worker: the record below still settles the run
        # The flag stays set: should the stop command miss the horse, the run still stops.
        self.store.finish(run_id, RunStatus.CANCELED, append_event=True, clear_cancel_flag=False,
                          error=make_error(
            f"Canceled: {reason}; the run did not stop within {CANCEL_WAIT_S:g} s, so its "
            f"work-horse process group (and its rank processes) was killed"))
        return self.store.status(run_id).value

    # -- health -----------------------------------------------------------------------------

    def ping(self) -> bool:
        """True if Redis answers."""
        try:
            return bool(self.redis.ping())
        except (redis.RedisError, OSError):
            return False

    def workers(self) -> list[dict[str, Any]]:
        """Live workers: ``{name, host, pid, devices, gpus, ts, current_run, state}`` (ts = unix
        seconds of the last heartbeat; devices = ``[{name, kind, total_memory_bytes, ...}]``;
        gpus = live NVML figures ``[{index, name, memory_used_bytes, memory_total_bytes,
        utilization_pct}]``, empty on a host without GPUs)."""
        return read_workers(self.redis)


def cli_client(url: str | None) -> DdpvizClient:
    """The client a CLI command talks to Redis with: a short reply timeout (`CLI_SOCKET_TIMEOUT_S`, no retry), so a
    frozen server is said in seconds (`workers.cli.commands.main`), never waited on for minutes."""
    from ddpviz.workers.connection import CLI_RETRY_ATTEMPTS, CLI_SOCKET_TIMEOUT_S

    return DdpvizClient(url=url, socket_timeout_s=CLI_SOCKET_TIMEOUT_S, retry_attempts=CLI_RETRY_ATTEMPTS)
