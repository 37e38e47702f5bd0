"""Events and the sinks that carry them out of a run.

An event is one JSON-able dict with `type`, `run_id`, `ts` (unix seconds, float) and, where it
applies, `rank`/`device` and `step` (docs/events.md). The engine only knows the `EventSink`
protocol; the Redis stream sink lives in `workers/`, so the engine never imports redis.

Observability never blocks training: `engine.batching.BatchingSink` hands events to a background
thread that writes them in batches.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Protocol

import orjson


EVENT_TYPES = ("run_started", "step", "bucket", "dp_phase", "gil", "memory", "comm_volume", "eval", "sync",
               "log", "allreduce_probe", "run_finished", "fsdp_collective", "fsdp_memory_curve",
               "memory_readings")


def _jsonable(obj: Any) -> Any:
    """Fallback for the encoder: numpy/torch scalars via .item(), sets as lists, else str."""
    if hasattr(obj, "item"):
        try:
            return obj.item()
        except (TypeError, ValueError):
            pass
    if isinstance(obj, (set, frozenset)):
        return list(obj)
    return str(obj)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def encode_json(obj: Any) -> bytes:
    """Compact strict JSON in UTF-8 (orjson): NaN and ±inf become null (browsers reject NaN),
    dict keys become strings, numpy/torch scalars their `.item()`."""
    try:
        return orjson.dumps(obj, default=_jsonable, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:  # e.g. an int beyond 64 bits: the standard library's way
        return json.dumps(_finite(json.loads(json.dumps(obj, default=_jsonable))),
                          separators=(",", ":"), allow_nan=False).encode()


def decode_json(raw: bytes | str) -> Any:
    """The object a JSON document holds (orjson; `encode_json`'s inverse)."""
    return orjson.loads(raw)


# Phases of a traced step's `memory` event that are the instrument's own work, not training (the app
# draws them in the instrument's colour, docs/events.md): DP's replica checksums on check steps, and
# the traced window after a step's last phase (DDP, single: the sampled step's profiler read, the
# memory ledger's close), which the curve spans and no training phase covers.
REPLICA_CHECK_PHASE = "replica check (instrument)"
AFTER_STEP_PHASE = "after the step (instrument)"
NONFINITE_SUFFIX = "_nonfinite"  # `loss: null, loss_nonfinite: "nan"` (docs/events.md, "Non-finite values")


def nonfinite_name(value: float) -> str:
    """``"nan"``, ``"inf"`` or ``"-inf"``: how a non-finite float is named beside its null."""
    return "nan" if value != value else ("inf" if value > 0 else "-inf")


def mark_nonfinite(fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` with each NaN/±inf float value (at the top level or in a nested dict) replaced by
    None and named in a sibling ``<key>_nonfinite`` (`nonfinite_name`); `fields` itself when there
    is none. Values inside lists become null on encoding (`encode_json`) without a name.

    Strict JSON has no NaN (browsers and `json.loads(strict)` consumers reject it), and a bare null
    would read as "not measured": the sibling says what the value was.
    """
    out = None
    for k, v in fields.items():
        c = v.__class__
        if c is float:
            if v - v == 0:  # finite (NaN - NaN and inf - inf are NaN)
                continue
            new, extra = None, {f"{k}{NONFINITE_SUFFIX}": nonfinite_name(v)}
        elif c is dict:
            new = mark_nonfinite(v)
            if new is v:
                continue
            extra = {}
        else:
            continue
        if out is None:
            out = dict(fields)
        out[k] = new
        out.update(extra)
    return fields if out is None else out


def make_event(type_: str, run_id: str, **fields: Any) -> dict[str, Any]:
    """Build one event: ``{"type", "run_id", "ts", **fields}`` (ts in unix seconds), non-finite
    floats marked (`mark_nonfinite`), so every consumer reads the same event whether it came
    through JSON or not."""
    if type_ not in EVENT_TYPES:
        raise ValueError(f"event type must be one of {EVENT_TYPES} (got {type_!r})")
    return {"type": type_, "run_id": run_id, "ts": time.time(), **mark_nonfinite(fields)}


def make_events(type_: str, run_id: str, rows: Iterable[dict[str, Any]], **common: Any) -> list[dict[str, Any]]:
    """One event per row, each equal to ``make_event(type_, run_id, **common, **row)`` save for one
    shared `ts` (a step's buckets are emitted together): the type checked once, `common` marked once
    (`mark_nonfinite`). A row's key overrides the same key in `common`. ~1.6 µs an event against
    ~4.4 µs for `make_event` + `emit` each (48 bucket rows, this 2-core machine, issue 31): the
    events a DDP step emits per bucket are the instrument's own cost per bucket.

    Raises:
        ValueError: `type_` is not in `EVENT_TYPES`.
    """
    if type_ not in EVENT_TYPES:
        raise ValueError(f"event type must be one of {EVENT_TYPES} (got {type_!r})")
    head = {"type": type_, "run_id": run_id, "ts": time.time(), **mark_nonfinite(common)}
    return [{**head, **mark_nonfinite(row)} for row in rows]


def emit_all(sink: Any, events: list[dict[str, Any]]) -> None:
    """Hand `events` to `sink` at once where it takes a batch (`emit_many`: one lock), else one by one."""
    many = getattr(sink, "emit_many", None)
    if many is not None:
        many(events)
    else:
        for e in events:
            sink.emit(e)


class RawEvent(dict):
    """An event read back from JSON that remembers the compact JSON it came from (`raw`).

    Forwarding an event from a rank's file to Redis then costs one parse (the summary builder
    needs the dict) and no second encoding (`workers.sink.encode_event` reuses `raw`). Any change
    to the dict forgets `raw`, so what is stored is always the dict as it is now.
    """

    __slots__ = ("raw",)

    def __init__(self, fields: dict[str, Any], raw: bytes | None = None):
        super().__init__(fields)
        self.raw = raw

    def _changed(name):  # noqa: N805  (a decorator factory used in the class body only)
        def method(self, *args, **kwargs):
            self.raw = None
            return getattr(dict, name)(self, *args, **kwargs)
        method.__name__ = name
        return method

    __setitem__ = _changed("__setitem__")
    __delitem__ = _changed("__delitem__")
    update = _changed("update")
    setdefault = _changed("setdefault")
    pop = _changed("pop")
    popitem = _changed("popitem")
    clear = _changed("clear")
    __ior__ = _changed("__ior__")
    del _changed


class EventSink(Protocol):
    """Where events go. `emit` must be cheap; `close` flushes everything."""

    def emit(self, event: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class BatchWriter(Protocol):
    """A destination that takes events a batch at a time (a file, a Redis stream)."""

    def write_batch(self, events: list[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...


class ListSink:
    """Keeps events in memory (`.events`), for tests and `compare`."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def emit(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.events.append(event)

    def emit_many(self, events: list[dict[str, Any]]) -> None:
        with self._lock:
            self.events.extend(events)

    def write_batch(self, events: list[dict[str, Any]]) -> None:
        with self._lock:
            self.events.extend(events)

    def of_type(self, type_: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == type_]

    def close(self) -> None:
        pass


class JsonlWriter:
    """Appends events as JSON lines to `path` (one `encode_json` object per line), a batch at a
    time: a batch whose write fails is cut back off the file (best effort), so a reader never
    meets half a batch and a failed write loses exactly its batch.

    Raises:
        OSError: from `write_batch` when the file cannot take the batch (disk full, closed).
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "ab", buffering=0)  # unbuffered: a failed write leaves nothing behind

    def write_batch(self, events: list[dict[str, Any]]) -> None:
        data = memoryview(b"".join(encode_json(e) + b"\n" for e in events))
        fd = self._fh.fileno()
        start = os.fstat(fd).st_size
        try:
            while data:
                data = data[self._fh.write(data):]
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise

    def emit(self, event: dict[str, Any]) -> None:
        self.write_batch([event])

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()


class FanoutSink:
    """Sends every event to several sinks (e.g. a Redis stream and a progress bar)."""

    def __init__(self, *sinks: EventSink):
        self.sinks = sinks

    def emit(self, event: dict[str, Any]) -> None:
        for s in self.sinks:
            s.emit(event)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


class CallbackSink:
    """Calls `fn(event)` for each event (progress bars, live printing)."""

    def __init__(self, fn):
        self.fn = fn

    def emit(self, event: dict[str, Any]) -> None:
        self.fn(event)

    def close(self) -> None:
        pass


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All events of a JSONL file (one object per line)."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


class JsonlTail:
    """Reads the complete lines appended to a JSONL file since the last call.

    Used by the DDP launcher to forward the events each rank process writes to its own file. The
    file stays open between calls (a read is then one `read()`); each event comes back as a
    `RawEvent` holding its line.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._fh = None
        self._partial = b""

    def read_new(self) -> list[dict[str, Any]]:
        if self._fh is None:
            try:
                self._fh = open(self.path, "rb")
            except FileNotFoundError:
                return []
        data = self._fh.read()
        if not data:
            return []
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        return [RawEvent(decode_json(line), line) for line in lines if line.strip()]

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
