"""Why a running run should stop: a cancel request, its time limit, or a broken event stream.

`StopPoller` is the engine's ``should_stop``. The engine calls it between steps (single, DP) or
from the DDP launcher's follower thread, which then kills every rank process. It must never block
training, so it asks Redis on a connection that fails fast (`fast_fail`) and at most once per
`interval_s`; a Redis error counts as "go on".
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger("ddpviz.worker")

CANCEL_POLL_INTERVAL_S = 0.2  # the engine may poll should_stop often; Redis is asked at ~5 Hz
FAST_FAIL_SOCKET_TIMEOUT_S = 2.0  # a poll that gets no answer this quickly is skipped


def fast_fail(client: redis.Redis) -> redis.Redis:
    """A client to the same server as `client` that never retries and times out after
    `FAST_FAIL_SOCKET_TIMEOUT_S` (for checks that must not stall a training loop)."""
    pool = client.connection_pool
    kwargs = {**pool.connection_kwargs, "retry": Retry(NoBackoff(), 0),
              "socket_timeout": FAST_FAIL_SOCKET_TIMEOUT_S,
              "socket_connect_timeout": FAST_FAIL_SOCKET_TIMEOUT_S}
    return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class,
                                                            **kwargs))


class StopPoller:
    """``should_stop`` for the engine: True once the run should end, and `kind` says why.

    Args:
        store: a `RunStore` (ideally on a `fast_fail` connection).
        run_id: the run.
        interval_s: Redis is asked at most this often.
        time_limit_s: the run stops this long after the poller is made (None: never).
        deadline: `time.monotonic()` at which the run stops instead (its start + the limit, when
            the poller is made later than the run started).
        writer: a `workers.sink.RedisStreamWriter` whose `problem` stops the run.

    Attributes:
        kind: None, ``cancel``, ``timeout`` or ``stream``.
        reason: words for the record's error (the cancel request's reason, or why).
    """

    def __init__(self, store: Any, run_id: str, interval_s: float = CANCEL_POLL_INTERVAL_S, *,
                 time_limit_s: float | None = None, writer: Any = None,
                 deadline: float | None = None):
        self.store, self.run_id, self.interval_s = store, run_id, interval_s
        self.time_limit_s, self.writer = time_limit_s, writer
        self.deadline = deadline if deadline is not None else (
            time.monotonic() + time_limit_s if time_limit_s else None)
        self.kind: str | None = None
        self.reason: str | None = None
        self._next_check = 0.0
        self._unreachable = False

    def __call__(self) -> bool:
        if self.kind is not None:
            return True
        now = time.monotonic()
        if self.deadline is not None and now >= self.deadline:
            self.kind = "timeout"
            self.reason = f"the run exceeded its time limit of {self.time_limit_s:g} s"
            return True
        problem = getattr(self.writer, "problem", None)
        if problem:
            self.kind, self.reason = "stream", problem
            return True
        if now < self._next_check:
            return False
        self._next_check = now + self.interval_s
        try:
            reason = self.store.cancel_reason(self.run_id)
        except (redis.RedisError, OSError) as exc:
            if not self._unreachable:  # once per outage, not 5 times a second
                log.warning("run %s: cannot read the cancel flag: %s", self.run_id, exc)
            self._unreachable = True
            return False
        self._unreachable = False
        if reason is not None:
            self.kind, self.reason = "cancel", reason
        return self.kind is not None
