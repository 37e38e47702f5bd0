"""Retention: which old runs a worker deletes, so Redis does not grow with every run.

Policy (`RetentionPolicy`): keep the newest `keep_runs` runs (by created time) and nothing older
than `keep_days` days; either limit may be off. Whatever the limits say, a pinned run is kept,
and a queued or started run is never deleted. Runs are ordered by the index ``ddpviz:runs``
(scored by created time); a deleted run loses its record, its event stream, its cancel flag, its
multi-host node state and its RQ job, as `workers.history.delete_run` does.

Configured per worker: ``ddpviz worker --keep-runs N --keep-days D`` or the environment
(`KEEP_RUNS_ENV`, `KEEP_DAYS_ENV`; 0 turns a limit off). A worker applies its policy when it
starts and after each run it ran ends, and publishes it in ``ddpviz:retention`` so the Runs page
can say what will be kept.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Mapping

import redis

from ddpviz.workers import keys

log = logging.getLogger("ddpviz.worker")

KEEP_RUNS_ENV = "DDPVIZ_KEEP_RUNS"
KEEP_DAYS_ENV = "DDPVIZ_KEEP_DAYS"
DEFAULT_KEEP_RUNS = 500  # ~1 MiB each for a typical demo run: Redis stays well under 1 GiB
DEFAULT_KEEP_DAYS = 0.0  # off: age alone deletes nothing unless asked
DAY_S = 86_400.0
ACTIVE_STATUSES = (b"queued", b"started")
RETENTION_KEY = keys.RETENTION  # hash: keep_runs, keep_days, worker, ts


class RetentionError(ValueError):
    """A retention setting breaks a rule; the message names the setting."""


@dataclass(frozen=True)
class RetentionPolicy:
    """Keep the newest `keep_runs` runs and none older than `keep_days` days (0 = no limit).

    Raises:
        RetentionError: a limit is negative or not finite (names the field).
    """

    keep_runs: int = DEFAULT_KEEP_RUNS
    keep_days: float = DEFAULT_KEEP_DAYS

    def __post_init__(self) -> None:
        if not isinstance(self.keep_runs, int) or self.keep_runs < 0:
            raise RetentionError(f"keep_runs must be an integer >= 0 (0 = no limit); got {self.keep_runs!r}")
        if not math.isfinite(self.keep_days) or self.keep_days < 0:
            raise RetentionError(f"keep_days must be a number >= 0 (0 = no limit); got {self.keep_days!r}")

    @property
    def active(self) -> bool:
        return bool(self.keep_runs or self.keep_days)

    def describe(self) -> str:
        """The policy in one sentence, as the Runs page shows it."""
        limits = ([f"the newest {self.keep_runs} runs"] if self.keep_runs else []) + \
                 ([f"runs from the last {self.keep_days:g} days"] if self.keep_days else [])
        if not limits:
            return "Every run is kept (no retention limit set)."
        return (f"Workers keep {' and '.join(limits)}; older runs are deleted after each run "
                f"ends. Pinned runs and runs still queued or running are always kept.")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "RetentionPolicy":
        """The policy set by `KEEP_RUNS_ENV` / `KEEP_DAYS_ENV` (defaults where unset).

        Raises:
            RetentionError: a variable is not a number or breaks its rule (names the variable).
        """
        env = os.environ if env is None else env
        runs, days = env.get(KEEP_RUNS_ENV, "").strip(), env.get(KEEP_DAYS_ENV, "").strip()
        try:
            keep_runs = int(runs) if runs else DEFAULT_KEEP_RUNS
        except ValueError:
            raise RetentionError(f"{KEEP_RUNS_ENV} must be an integer >= 0 (got {runs!r})") from None
        try:
            keep_days = float(days) if days else DEFAULT_KEEP_DAYS
        except ValueError:
            raise RetentionError(f"{KEEP_DAYS_ENV} must be a number >= 0 (got {days!r})") from None
        try:
            return cls(keep_runs, keep_days)
        except RetentionError as exc:
            raise RetentionError(f"{KEEP_RUNS_ENV}/{KEEP_DAYS_ENV}: {exc}") from None


def select_prunable(runs: list[tuple[str, float]], status: Mapping[str, str | None],
                    pinned: set[str], policy: RetentionPolicy, now: float) -> list[str]:
    """The run ids the policy deletes.

    Args:
        runs: (run_id, created_at unix s) of every run, in any order.
        status: run_id -> status (``queued``/``started`` are never deleted; None = no record).
        pinned: ids that are kept whatever their age or rank.
        now: unix seconds the ages are measured at.

    Returns:
        ids, oldest first: those beyond the newest `keep_runs` or older than `keep_days`, minus
        pinned and queued/started runs.
    """
    newest_first = sorted(runs, key=lambda r: (-r[1], r[0]))
    out = []
    for i, (rid, created) in enumerate(newest_first):
        beyond_count = bool(policy.keep_runs) and i >= policy.keep_runs
        too_old = bool(policy.keep_days) and now - created > policy.keep_days * DAY_S
        if (beyond_count or too_old) and rid not in pinned and status.get(rid) not in ("queued", "started"):
            out.append(rid)
    return out[::-1]


def apply_retention(r: redis.Redis, policy: RetentionPolicy, now: float | None = None) -> list[str]:
    """Delete the runs `policy` does not keep; returns their ids (oldest first).

    Each deletion re-checks, in a WATCH/MULTI/EXEC, that the run is neither active nor pinned,
    so a run pinned or re-started meanwhile survives.
    """
    if not policy.active:
        return []
    now = time.time() if now is None else now
    runs = [(rid.decode(), score) for rid, score in r.zrange(keys.RUNS, 0, -1, withscores=True)]
    pipe = r.pipeline(transaction=False)
    for rid, _ in runs:
        pipe.hmget(keys.run(rid), "status", "pinned")
    fields = pipe.execute() if runs else []
    status = {rid: (s.decode() if s else None) for (rid, _), (s, _) in zip(runs, fields)}
    pinned = {rid for (rid, _), (_, p) in zip(runs, fields) if p == b"1"}
    deleted = [rid for rid in select_prunable(runs, status, pinned, policy, now) if _delete(r, rid)]
    if deleted:
        log.info("retention: deleted %d run(s) (%s)", len(deleted), policy.describe())
    return deleted


def _delete(r: redis.Redis, run_id: str) -> bool:
    from ddpviz.workers.keys import rq_job_ids

    key = keys.run(run_id)
    job_ids = rq_job_ids(r, run_id)  # read before the record (which names node jobs) is gone
    with r.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(key)
            state, pin = pipe.hmget(key, "status", "pinned")
            if state in ACTIVE_STATUSES or pin == b"1":
                pipe.unwatch()
                return False
            pipe.multi()
            pipe.delete(key, keys.events(run_id), keys.cancel(run_id), keys.nodes(run_id))
            pipe.zrem(keys.RUNS, run_id)
            pipe.srem(keys.STARTED, run_id)
            pipe.execute()
        except redis.WatchError:
            return False  # changed meanwhile: looked at again next time
    _delete_rq_jobs(r, job_ids)
    return True


def _delete_rq_jobs(r: redis.Redis, job_ids: list[str]) -> None:
    """The run's RQ job(s) and their registry entries (they would expire anyway, see
    `workers.client.RESULT_TTL_S`)."""
    from rq.exceptions import NoSuchJobError
    from rq.job import Job
    from rq.serializers import JSONSerializer

    for job_id in job_ids:
        try:
            job = Job.fetch(job_id, connection=r, serializer=JSONSerializer)
            if keys.parse_pair_job_id(job_id) and job.get_status(refresh=False) in ("queued", "started"):
                continue  # a pair's job still training the other run (workers.jobs.pair): it expires later
            job.delete()
        except NoSuchJobError:
            pass


def set_pinned(r: redis.Redis, run_id: str, pinned: bool) -> bool:
    """Pin (keep whatever the policy) or unpin a run. False if there is no such run."""
    key = keys.run(run_id)
    with r.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(key)
                if not pipe.exists(key):
                    pipe.unwatch()
                    return False
                pipe.multi()
                pipe.hset(key, "pinned", "1" if pinned else "")
                pipe.execute()
                return True
            except redis.WatchError:
                continue


def publish_policy(r: redis.Redis, policy: RetentionPolicy, worker: str) -> None:
    """Record the policy this worker applies, for the Runs page (`read_policy`)."""
    r.hset(RETENTION_KEY, mapping={"keep_runs": policy.keep_runs, "keep_days": repr(policy.keep_days),
                                   "worker": worker, "ts": repr(time.time())})


def read_policy(r: redis.Redis) -> dict[str, Any] | None:
    """{keep_runs, keep_days, worker, ts, text} last published by a worker, or None."""
    h = r.hgetall(RETENTION_KEY)
    if not h:
        return None
    try:
        policy = RetentionPolicy(int(h[b"keep_runs"]), float(h[b"keep_days"]))
    except (KeyError, ValueError):
        return None
    return {"keep_runs": policy.keep_runs, "keep_days": policy.keep_days,
            "worker": h.get(b"worker", b"").decode(), "ts": float(h.get(b"ts") or 0),
            "text": policy.describe()}


def retain_quietly(r: redis.Redis, worker: str) -> list[str]:
    """Apply this process's policy (`RetentionPolicy.from_env`) and publish it; Redis errors and
    a bad setting are logged, never raised (retention must not fail a run or stop a worker)."""
    try:
        policy = RetentionPolicy.from_env()
        publish_policy(r, policy, worker)
        return apply_retention(r, policy)
    except (redis.RedisError, OSError, RetentionError) as exc:
        log.warning("retention skipped: %s", exc)
        return []

