"""The Redis stream an engine run writes its events into, and how events are encoded there.

Each event is one stream entry with a single field ``e`` holding the event's JSON. Streams are
capped with ``XADD ... MAXLEN ~ n``: Redis trims whole macro-nodes, so a stream may briefly hold
somewhat more than `maxlen` entries, and trimming costs O(1) amortised (see the XADD docs,
https://redis.io/docs/latest/commands/xadd/).

Use with `engine.batching.BatchingSink`, which calls `write_batch` from a background thread
(`run_sink` builds the pair the worker uses):

    sink, writer = run_sink(redis, run_id)

Redis going away (a restart, a network cut) loses no event within a bound: the writer keeps what
it could not write, in order, and writes it first once Redis answers again. Past
`MAX_PENDING_EVENTS` it drops the oldest (never ``run_started``), counts them, and says so
(`problem`), which fails the run with that cause (`workers.host.stop.StopPoller`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import redis

from ddpviz.engine.events import decode_json, encode_json
from ddpviz.workers import keys

# Events kept per run. A 150-step DDP run on 2 ranks emits ~2 K events; 100 K keeps every event
# of runs up to thousands of steps (a long run loses its oldest per-step events, never its tail).
DEFAULT_STREAM_MAXLEN = 100_000
MAX_PENDING_EVENTS = 20_000  # kept while Redis is unreachable (~10 MB; minutes of a 2-rank run)
OUTAGE_LIMIT_S = 300.0  # Redis unreachable longer than this fails the run
CLOSE_TIMEOUT_S = 30.0  # close() keeps retrying what is pending this long
WRITE_CHUNK = 512  # events per script call (or MULTI/EXEC)
# The worker's BatchingSink writes to Redis this often (seconds): the last hop of an event's way
# from a rank to the app (see engine.batching.RANK_FLUSH_INTERVAL_S); one write per interval.
RUN_FLUSH_INTERVAL_S = 0.02

# Appends every ARGV[2..] as one entry (field `e`) of stream KEYS[1], trimmed to ~ARGV[1] entries.
# One command carries a whole chunk: redis-py packs it once instead of once per XADD, and Redis
# runs the script atomically, so a chunk is stored whole or not at all, as with MULTI/EXEC.
XADD_MANY_LUA = """
local key, maxlen = KEYS[1], ARGV[1]
for i = 2, #ARGV do
  redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*', 'e', ARGV[i])
end
return #ARGV - 1
"""

log = logging.getLogger("ddpviz.worker")


def encode_event(event: dict[str, Any]) -> bytes:
    """The stored form of one event: compact strict JSON, UTF-8 (`engine.events.encode_json`).

    An `engine.events.RawEvent` read from a rank's file is stored as the line it was read from
    (written by the same encoder) unless that line holds a NaN or an infinity, which strict JSON
    has no word for.
    """
    raw = getattr(event, "raw", None)
    if raw is not None and b"NaN" not in raw and b"Infinity" not in raw:
        return raw
    return encode_json(event)


def decode_entries(entries: list[tuple[bytes, dict[bytes, bytes]]]) -> list[dict[str, Any]]:
    """Events of XRANGE/XREVRANGE entries, in the given order (entries without ``e`` skipped)."""
    out = []
    for _, fields in entries:
        raw = fields.get(keys.EVENT_FIELD)
        if raw is not None:
            out.append(decode_json(raw))
    return out


def add_event(pipe: Any, run_id: str, event: dict[str, Any], maxlen: int) -> None:
    """Queue one XADD of `event` on `pipe` (a pipeline or client), trimming to ~`maxlen`."""
    pipe.xadd(keys.events(run_id), {keys.EVENT_FIELD: encode_event(event)},
              maxlen=maxlen, approximate=True)


class RedisStreamWriter:
    """Writes batches of a run's events to ``ddpviz:events:{run_id}``, riding out Redis outages.

    Events that cannot be written now stay pending (in order) and go first at the next write;
    each chunk is one MULTI/EXEC, so a chunk is stored whole or not at all (a reply lost after
    EXEC can store it twice: at-least-once).

    Args:
        redis: client (``decode_responses=False``); not closed by `close()`.
        run_id: the run whose stream is written.
        maxlen: approximate cap on entries kept (``MAXLEN ~``).
        max_pending: events kept while Redis is unreachable (default `MAX_PENDING_EVENTS`);
            beyond, the oldest are dropped.
        close_timeout_s: how long `close()` retries what is still pending.

    Raises:
        RuntimeError: from `close()` when events are still pending after `close_timeout_s`.
    """

    def __init__(self, redis: redis.Redis, run_id: str, maxlen: int = DEFAULT_STREAM_MAXLEN,
                 max_pending: int | None = None, close_timeout_s: float = CLOSE_TIMEOUT_S):
        if maxlen < 1:
            raise ValueError(f"maxlen must be >= 1 (got {maxlen})")
        self.redis = redis
        self.run_id = run_id
        self.maxlen = maxlen
        self.max_pending = MAX_PENDING_EVENTS if max_pending is None else max_pending
        self.close_timeout_s = close_timeout_s
        self.written = 0  # events written so far
        self.dropped = 0  # events dropped because more than max_pending were waiting
        self.pending: deque[dict[str, Any]] = deque()
        self.failing_since: float | None = None  # time.monotonic() of the first failed write
        self.outages_s: list[float] = []  # length of each outage ridden out
        self.last_error: BaseException | None = None
        self._script = redis.register_script(XADD_MANY_LUA)
        self._use_script = True  # False once the server refuses scripts (an ACL, a renamed EVAL)

    def write_batch(self, events: list[dict[str, Any]]) -> None:
        """Append `events` after whatever is pending, in order; never raises for Redis errors."""
        self.pending.extend(events)
        while len(self.pending) > self.max_pending:
            self._drop_oldest()
        self._drain()

    def _drop_oldest(self) -> None:
        first = self.pending.popleft()
        if first.get("type") == "run_started":  # the one event the app cannot do without
            second = self.pending.popleft()
            self.pending.appendleft(first)
            first = second
        self.dropped += 1

    def _drain(self) -> bool:
        """Write everything pending. True if nothing is left."""
        while self.pending:
            chunk = [self.pending[i] for i in range(min(WRITE_CHUNK, len(self.pending)))]
            try:
                self._write_chunk(chunk)
            except (redis.RedisError, OSError) as exc:
                if self.failing_since is None:
                    self.failing_since = time.monotonic()
                    log.warning("run %s: cannot store events (%s); keeping them until Redis "
                                "answers", self.run_id, exc)
                self.last_error = exc
                return False
            for _ in chunk:
                self.pending.popleft()
            self.written += len(chunk)
        if self.failing_since is not None:
            self.outages_s.append(time.monotonic() - self.failing_since)
            log.warning("run %s: Redis answers again after %.1f s; %d events kept, %d dropped",
                        self.run_id, self.outages_s[-1], self.written, self.dropped)
            self.failing_since = None
        return True

    def _write_chunk(self, chunk: list[dict[str, Any]]) -> None:
        """Store `chunk` in order, whole or not at all (one script call, else one MULTI/EXEC)."""
        if self._use_script:
            try:
                self._script(keys=[keys.events(self.run_id)],
                             args=[self.maxlen, *map(encode_event, chunk)])
                return
            except redis.ResponseError as exc:  # NOPERM, unknown command: not an outage
                log.info("run %s: Redis refuses scripts (%s); writing events with MULTI/EXEC",
                         self.run_id, exc)
                self._use_script = False
        pipe = self.redis.pipeline(transaction=True)
        for event in chunk:
            add_event(pipe, self.run_id, event, self.maxlen)
        pipe.execute()

    @property
    def problem(self) -> str | None:
        """Why the stream can no longer be trusted (events dropped, or Redis gone longer than
        `OUTAGE_LIMIT_S`), or None."""
        down_s = time.monotonic() - self.failing_since if self.failing_since is not None else 0.0
        if not self.dropped and down_s <= OUTAGE_LIMIT_S:
            return None
        return (f"EventStreamLost: Redis was unreachable for {down_s:.0f} s "
                f"({self.last_error}); {self.dropped} events could not be kept "
                f"(at most {self.max_pending} wait for Redis)")

    def emit(self, event: dict[str, Any]) -> None:
        """Write one event now (unbatched)."""
        self.write_batch([event])

    def close(self) -> None:
        """Retry what is pending for up to `close_timeout_s` seconds (the Redis client belongs
        to the caller and stays open)."""
        deadline = time.monotonic() + self.close_timeout_s
        delay_s = 0.1
        while not self._drain():
            if time.monotonic() + delay_s > deadline:
                raise RuntimeError(f"{len(self.pending)} events of run {self.run_id} could not be "
                                   f"stored: {self.last_error}")
            time.sleep(delay_s)
            delay_s = min(delay_s * 2, 2.0)


def run_sink(redis: redis.Redis, run_id: str, maxlen: int = DEFAULT_STREAM_MAXLEN):
    """The sink a worker gives the engine for one run, and its writer.

    Returns:
        (`engine.batching.BatchingSink` writing every `RUN_FLUSH_INTERVAL_S`, `RedisStreamWriter`).
    """
    from ddpviz.engine.batching import BatchingSink

    writer = RedisStreamWriter(redis, run_id, maxlen)
    return BatchingSink(writer, flush_interval_s=RUN_FLUSH_INTERVAL_S), writer
