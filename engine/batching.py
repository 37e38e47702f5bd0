"""A process's events written off its training thread: `BatchingSink` buffers them and a background
thread writes them in batches (at most `max_batch` events or every `flush_interval_s`), builds the ones
handed over unbuilt (`Later`), and makes lost ones visible in the run (`loss_event`); `rank_sink` is a
DDP rank's. Event shapes and the other sinks: `engine.events`.
"""

from __future__ import annotations

import collections
import os
import threading
from typing import Any, Callable

from ddpviz.engine.events import BatchWriter, JsonlWriter, make_event
from ddpviz.engine.measure.own_threads import name_this_thread

# How long an event may wait in a rank's BatchingSink before it is written to the rank's file. The
# launcher's follower reads those files every `engine.modes.launcher.FOLLOW_INTERVAL_S` and the worker's
# sink writes to Redis every `workers.sink.RUN_FLUSH_INTERVAL_S`: each hop adds at most its interval
# to an event's latency (figure 1 of `ddpviz bench`). A wake-up is not free where the ranks fill the
# cores: on 2 gloo ranks of small steps (2 cores) the rank writers and the follower took 82 µs of CPU
# a step at 0.02 s and 56 at 0.05 s (medians of two rounds, `plain_alone`'s `background_us_per_step`), and
# DDP's latency p95 went 39 -> 94 ms (target 150; docs/bench/latency-2026-12-05.json).
RANK_FLUSH_INTERVAL_S = 0.05


class Later:
    """Events built by a `BatchingSink`'s writer thread, not by the thread that emits them:
    `fn(*args, **kwargs)` -> a list of `count` events (`build`), called once when the sink takes them, in
    their place in the order. For a hot path (a DDP rank's ordinary steps, an attached script's step)
    whose arguments are its only per-step work."""

    __slots__ = ("fn", "args", "count", "kwargs")

    def __init__(self, fn: Callable[..., list[dict[str, Any]]], args: tuple, count: int,
                 kwargs: dict[str, Any] | None = None):
        self.fn, self.args, self.count, self.kwargs = fn, args, count, kwargs

    def build(self) -> list[dict[str, Any]]:
        return self.fn(*self.args, **self.kwargs) if self.kwargs else self.fn(*self.args)


class BatchingSink:
    """Buffers events and writes them to `writer` from a background thread.

    Args:
        writer: the destination (`JsonlWriter`, a Redis stream writer, ...).
        max_batch: events per write, at most.
        flush_interval_s: seconds between writes when fewer than `max_batch` are waiting.

    Writer errors never reach the training loop, and never pass unseen: the events of a failed
    write are counted in `.lost_events` (`.dropped_batches` writes, `.last_error` the last error),
    and the next write that succeeds begins with a `log` event (`loss_event`: level "error",
    `events_lost`, the error) that says so in the run. Losses no later write could report are
    `.unreported_lost` after `close()`: the caller reports them another way (a rank process
    through `engine.modes.ranks.write_lost`).
    """

    def __init__(self, writer: BatchWriter, max_batch: int = 512, flush_interval_s: float = 0.2):
        self.writer = writer
        self.max_batch = max_batch
        self.flush_interval_s = flush_interval_s
        self.dropped_batches = 0
        self.lost_events = 0
        self.unreported_lost = 0
        self.last_error: BaseException | None = None
        self._lost_from: dict[str, Any] = {}  # run_id, rank, device of the first lost event
        # no lock on the emitting (training) thread: a deque's append and extend (of a list) run whole
        # under the GIL, and only `_flush_now` takes from the left, under `_write_lock`
        self._buf: collections.deque[dict[str, Any]] = collections.deque()
        self._wake = threading.Event()  # a full batch waiting, or close()
        self._write_lock = threading.Lock()  # one taker and writer at a time: events leave in order
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="ddpviz-event-flush", daemon=True)
        self._thread.start()

    def emit(self, event: dict[str, Any]) -> None:
        self._buf.append(event)
        if len(self._buf) >= self.max_batch:
            self._wake.set()

    def emit_many(self, events: list[dict[str, Any]]) -> None:
        """`emit` for each, at once: no lock (a step's events 1.9-2.0 µs against 4.5 with a Condition's, one
        process here, 2026-12-06), the writer thread woken only for a full batch."""
        self._buf.extend(events)
        if len(self._buf) >= self.max_batch:
            self._wake.set()

    def emit_later(self, later: Later) -> None:
        """Queue events that the writer thread builds (`Later`) where `emit_many` would put them: the
        emitting thread pays one append (a DDP rank's ordinary step: its bucket and step events)."""
        self._buf.append(later)
        if len(self._buf) >= self.max_batch:
            self._wake.set()

    def _flush_now(self) -> None:
        """Take what is buffered now and write it, in order (a taker holds `_write_lock` from take to write);
        a `Later` is built here, in its place. A builder that raises loses its events, counted like a failed
        write's (`lost_events`, then a `log` event in the run): telemetry never kills training."""
        with self._write_lock:
            buf = self._buf
            batch: list[dict[str, Any]] = []
            for _ in range(len(buf)):
                item = buf.popleft()
                if type(item) is not Later:
                    batch.append(item)
                    continue
                try:
                    batch.extend(item.build())
                except Exception as exc:
                    self._count_lost(item.count, exc, batch[-1:])
            for i in range(0, len(batch), self.max_batch):
                self._write_chunk(batch[i:i + self.max_batch])

    def _write_chunk(self, chunk: list[dict[str, Any]]) -> None:
        reported = self.unreported_lost
        if reported:
            chunk = [loss_event(reported, self.last_error, **self._lost_from), *chunk]
        try:
            self.writer.write_batch(chunk)
        except Exception as exc:  # telemetry must not kill training
            self.dropped_batches += 1
            self._count_lost(len(chunk) - (1 if reported else 0), exc, chunk)
        else:
            self.unreported_lost -= reported

    def _count_lost(self, lost: int, exc: BaseException, near: list[dict[str, Any]]) -> None:
        """Count `lost` events as lost (reported in the run by the next write); `near`: events whose
        run_id, rank and device name where they were lost, when no earlier loss did."""
        self.lost_events += lost
        self.unreported_lost += lost
        self.last_error = exc
        if not self._lost_from and near:
            self._lost_from = {k: near[-1][k] for k in ("run_id", "rank", "device") if k in near[-1]}

    def _loop(self) -> None:
        name_this_thread()
        while True:
            if not self._closed and len(self._buf) < self.max_batch:
                self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            closed = self._closed  # read after the clear: a close() that set the wake is never missed
            if self._buf:
                self._flush_now()
            if closed:
                return

    def flush(self) -> None:
        """Write everything buffered now (from the caller's thread); returns once every event emitted
        before the call is written, a write already under way in another thread included."""
        self._flush_now()

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=30)
        self.flush()
        if self.unreported_lost:  # one last try to say so in the run
            with self._write_lock:
                self._write_chunk([])
        self.writer.close()


def loss_event(events_lost: int, error: BaseException | str | None, run_id: str = "",
               **where: Any) -> dict[str, Any]:
    """The `log` event that makes lost events visible in the run: level "error", `events_lost`
    (events a failed write dropped since the last report), `error` (the writer's exception), and
    `rank`/`device` of the events lost. `engine.summary.SummaryBuilder` sums `events_lost`."""
    err = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else error
    return make_event("log", run_id, **where, level="error", events_lost=int(events_lost), error=err,
                      message=f"{events_lost} event(s) were lost: the event writer failed ({err}); "
                              "the run's charts and summary miss them")


def rank_sink(path: str | os.PathLike[str], flush_interval_s: float = RANK_FLUSH_INTERVAL_S) -> BatchingSink:
    """The sink a DDP rank process writes its events through: its own JSONL file, flushed by a
    background thread every `flush_interval_s` (default `RANK_FLUSH_INTERVAL_S`; the launcher's
    follower forwards the file)."""
    return BatchingSink(JsonlWriter(path), flush_interval_s=flush_interval_s)
