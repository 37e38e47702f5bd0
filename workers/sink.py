"""The Redis stream an engine run writes its events into, and how events are encoded there.

Each event is one stream entry with a single field ``e`` holding the event's JSON. Streams are
capped with ``XADD ... MAXLEN ~ n``: Redis trims whole macro-nodes, so a stream may briefly hold
somewhat more than `maxlen` entries, and trimming costs O(1) amortised (see the XADD docs,
https://redis.io/docs/latest/commands/xadd/).

Use with `engine.events.BatchingSink`, which calls `write_batch` from a background thread:

    sink = BatchingSink(RedisStreamWriter(redis, run_id))
"""

from __future__ import annotations

import json
import math
from typing import Any

import redis

from workers import keys

# Events kept per run. A 150-step DDP run on 2 ranks emits ~2 K events; 100 K keeps every event
# of runs up to thousands of steps (a long run loses its oldest per-step events, never its tail).
DEFAULT_STREAM_MAXLEN = 100_000


def _jsonable(obj: Any) -> Any:
    """Fallback for json.dumps: numpy/torch scalars via .item(), sets as lists, else str."""
    if hasattr(obj, "item"):
        try:
            return obj.item()
        except (TypeError, ValueError):
            pass
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


def _finite(obj: Any) -> Any:
    """NaN and ±inf become None, so the stored JSON is strict (browsers reject NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def encode_event(event: dict[str, Any]) -> bytes:
    """The stored form of one event: compact strict JSON, UTF-8."""
    try:
        text = json.dumps(event, separators=(",", ":"), default=_jsonable, allow_nan=False)
    except ValueError:  # a NaN/inf somewhere (a diverged loss): store it as null
        text = json.dumps(_finite(json.loads(json.dumps(event, default=_jsonable))),
                          separators=(",", ":"), allow_nan=False)
    return text.encode()


def decode_entries(entries: list[tuple[bytes, dict[bytes, bytes]]]) -> list[dict[str, Any]]:
    """Events of XRANGE/XREVRANGE entries, in the given order (entries without ``e`` skipped)."""
    out = []
    for _, fields in entries:
        raw = fields.get(keys.EVENT_FIELD)
        if raw is not None:
            out.append(json.loads(raw))
    return out


def add_event(pipe: Any, run_id: str, event: dict[str, Any], maxlen: int) -> None:
    """Queue one XADD of `event` on `pipe` (a pipeline or client), trimming to ~`maxlen`."""
    pipe.xadd(keys.events(run_id), {keys.EVENT_FIELD: encode_event(event)},
              maxlen=maxlen, approximate=True)


class RedisStreamWriter:
    """Writes batches of a run's events to ``ddpviz:events:{run_id}``.

    Args:
        redis: client (``decode_responses=False``); not closed by `close()`.
        run_id: the run whose stream is written.
        maxlen: approximate cap on entries kept (``MAXLEN ~``).

    Raises:
        redis.RedisError: from `write_batch` when Redis is unreachable (BatchingSink counts it
            and keeps training).
    """

    def __init__(self, redis: redis.Redis, run_id: str, maxlen: int = DEFAULT_STREAM_MAXLEN):
        if maxlen < 1:
            raise ValueError(f"maxlen must be >= 1 (got {maxlen})")
        self.redis = redis
        self.run_id = run_id
        self.maxlen = maxlen
        self.written = 0  # events written so far

    def write_batch(self, events: list[dict[str, Any]]) -> None:
        """Append `events` in order with one pipelined round trip."""
        if not events:
            return
        pipe = self.redis.pipeline(transaction=False)
        for event in events:
            add_event(pipe, self.run_id, event, self.maxlen)
        pipe.execute()
        self.written += len(events)

    def emit(self, event: dict[str, Any]) -> None:
        """Write one event now (unbatched)."""
        self.write_batch([event])

    def close(self) -> None:
        pass  # the Redis client belongs to the caller
