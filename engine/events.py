"""Events and the sinks that carry them out of a run.

An event is one JSON-able dict with `type`, `run_id`, `ts` (unix seconds, float) and, where it
applies, `rank`/`device` and `step` (docs/events.md). The engine only knows the `EventSink`
protocol; the Redis stream sink lives in `workers/`, so the engine never imports redis.

Observability never blocks training: `BatchingSink` hands events to a background thread that
writes them in batches (at most `max_batch` events or every `flush_interval_s`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Protocol

EVENT_TYPES = ("run_started", "step", "bucket", "dp_phase", "memory", "comm_volume", "eval", "sync",
               "log", "run_finished")


def make_event(type_: str, run_id: str, **fields: Any) -> dict[str, Any]:
    """Build one event: ``{"type", "run_id", "ts", **fields}`` (ts in unix seconds)."""
    if type_ not in EVENT_TYPES:
        raise ValueError(f"event type must be one of {EVENT_TYPES} (got {type_!r})")
    return {"type": type_, "run_id": run_id, "ts": time.time(), **fields}


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

    def write_batch(self, events: list[dict[str, Any]]) -> None:
        with self._lock:
            self.events.extend(events)

    def of_type(self, type_: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == type_]

    def close(self) -> None:
        pass


class JsonlWriter:
    """Appends events as JSON lines to `path` (one object per line, flushed per batch)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8")

    def write_batch(self, events: list[dict[str, Any]]) -> None:
        self._fh.write("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events))
        self._fh.flush()

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


class BatchingSink:
    """Buffers events and writes them to `writer` from a background thread.

    Args:
        writer: the destination (`JsonlWriter`, a Redis stream writer, ...).
        max_batch: events per write, at most.
        flush_interval_s: seconds between writes when fewer than `max_batch` are waiting.

    Writer errors are counted in `.dropped_batches` and kept in `.last_error`, never raised into
    the training loop; `close()` flushes what is left and raises the last error if the final
    flush fails, so a lost tail is visible.
    """

    def __init__(self, writer: BatchWriter, max_batch: int = 512, flush_interval_s: float = 0.2):
        self.writer = writer
        self.max_batch = max_batch
        self.flush_interval_s = flush_interval_s
        self.dropped_batches = 0
        self.last_error: BaseException | None = None
        self._buf: list[dict[str, Any]] = []
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="ddpviz-event-flush", daemon=True)
        self._thread.start()

    def emit(self, event: dict[str, Any]) -> None:
        with self._cv:
            self._buf.append(event)
            if len(self._buf) >= self.max_batch:
                self._cv.notify()

    def _take(self) -> list[dict[str, Any]]:
        batch, self._buf = self._buf, []
        return batch

    def _write(self, batch: list[dict[str, Any]]) -> None:
        for i in range(0, len(batch), self.max_batch):
            try:
                self.writer.write_batch(batch[i:i + self.max_batch])
            except Exception as exc:  # telemetry must not kill training
                self.dropped_batches += 1
                self.last_error = exc

    def _loop(self) -> None:
        while True:
            with self._cv:
                if not self._closed and len(self._buf) < self.max_batch:
                    self._cv.wait(self.flush_interval_s)
                batch, closed = self._take(), self._closed
            if batch:
                self._write(batch)
            if closed:
                return

    def flush(self) -> None:
        """Write everything buffered now (from the caller's thread)."""
        with self._cv:
            batch = self._take()
        if batch:
            self._write(batch)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=30)
        self.flush()
        self.writer.close()


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All events of a JSONL file (one object per line)."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


class JsonlTail:
    """Reads the complete lines appended to a JSONL file since the last call.

    Used by the DDP launcher to forward the events each rank process writes to its own file.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._pos = 0
        self._partial = b""

    def read_new(self) -> Iterable[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as fh:
            fh.seek(self._pos)
            data = fh.read()
        self._pos += len(data)
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]
