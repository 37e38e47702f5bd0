"""Per-rank telemetry: builds events with the run's identity and a monotonic clock.

`Telemetry.emit` adds `run_id`, `rank`, `device` and `ts`; `emit_many` does so for a step's rows at once. Times inside a step are taken with
`time.perf_counter()` and reported in seconds relative to an origin (the step or backward start).
"""

from __future__ import annotations

import time
from typing import Any

from ddpviz.engine.events import EVENT_TYPES, EventSink, emit_all, make_event, make_events
from ddpviz.engine.batching import Later


class Telemetry:
    """Emits events for one rank (DDP) or one process (single/DP, rank 0)."""

    def __init__(self, sink: EventSink, run_id: str, rank: int = 0, device: str = "cpu:0", host: str = ""):
        self.sink, self.run_id, self.rank, self.device, self.host = sink, run_id, rank, device, host

    def emit(self, type_: str, **fields: Any) -> None:
        self.sink.emit(self.build(type_, **fields))

    def build(self, type_: str, **fields: Any) -> dict[str, Any]:
        """The event `emit` would hand to the sink, not handed over (for `hand_over`)."""
        return make_event(type_, self.run_id, **self._identity(fields))

    def head(self, type_: str, **constant: Any) -> dict[str, Any]:
        """The constant part of this emitter's `type_` events, for a hot path that emits the same
        shape every step: ``{**head, "ts": time.time(), "step": s, **varying}`` has the keys and
        values `emit(type_, step=s, **constant, **varying)` gives, without its per-call checks.
        `constant` is marked once (`mark_nonfinite`); `varying`'s non-finite floats are the caller's
        to mark. Raises ValueError for a `type_` not in `EVENT_TYPES`."""
        return make_event(type_, self.run_id, step=None, **self._identity(constant))

    def hand_over(self, events: list[dict[str, Any]]) -> None:
        """Give built events (`build`, `head`) to the sink at once, in order."""
        emit_all(self.sink, events)

    def hand_over_later(self, later: Later) -> None:
        """Give the sink events it builds itself (`Later`, on a `BatchingSink`'s writer thread), in their
        place in the order; a sink that cannot is handed `later`'s events built now."""
        emit_later = getattr(self.sink, "emit_later", None)
        if emit_later is not None:
            emit_later(later)
        else:
            emit_all(self.sink, later.build())

    def emit_soon(self, type_: str, rows: list[dict[str, Any]], **common: Any) -> None:
        """`emit_many(type_, rows, **common)`, with the events built on the sink's writer thread where the sink
        can (`hand_over_later`): the caller pays a clock read and one append, not the build (an attached
        script's step and bucket events: 2 x ~15 µs a step on its training thread here, 2026-12-06). `ts` is
        this call's time. The caller hands `rows` over: they must not change after the call.

        Raises:
            ValueError: `type_` is not in `EVENT_TYPES` (checked now, not on the writer thread).
        """
        if type_ not in EVENT_TYPES:
            raise ValueError(f"event type must be one of {EVENT_TYPES} (got {type_!r})")
        common["ts"] = time.time()  # make_events' stamp, overridden by common's
        self.hand_over_later(Later(make_events, (type_, self.run_id, rows), len(rows), self._identity(common)))

    def build_many(self, type_: str, rows: list[dict[str, Any]], **common: Any) -> list[dict[str, Any]]:
        """The events `emit_many` would hand to the sink, not handed over (for `hand_over`)."""
        return make_events(type_, self.run_id, rows, **self._identity(common))

    def emit_many(self, type_: str, rows: list[dict[str, Any]], **common: Any) -> None:
        """`emit(type_, **common, **row)` for each row, built and handed to the sink at once
        (`engine.events.make_events`: one `ts`; a row's key overrides `common`'s)."""
        emit_all(self.sink, self.build_many(type_, rows, **common))

    def _identity(self, fields: dict[str, Any]) -> dict[str, Any]:
        """`fields` with this emitter's rank, device and host where they do not say their own."""
        fields.setdefault("rank", self.rank)
        fields.setdefault("device", self.device)
        if self.host:
            fields.setdefault("host", self.host)
        return fields


def should_sample_memory(step: int, steps: int) -> bool:
    """Memory events: every step for the first 5, then about 100 per run, and the last step."""
    return step < 5 or step == steps - 1 or step % max(1, steps // 100) == 0


now = time.perf_counter
_WALL_OFFSET_S = time.time() - time.perf_counter()


def wall_ts(perf_t: float) -> float:
    """Unix seconds of a `now()` reading (for placing spans on a shared timeline, e.g. Chrome trace)."""
    return perf_t + _WALL_OFFSET_S


def step_fields(*, loss: float, samples: int, step_time_s: float, forward_s: float,
                backward_s: float, comm_exposed_s: float | None, optimizer_s: float, start: float,
                **extra: Any) -> dict[str, Any]:
    """The `step` event's measures; samples_per_s = samples / step_time_s. `comm_exposed_s` is
    None where the mode cannot measure it (FSDP on CUDA), never a stand-in number: an `extra`
    `comm_exposed_measured=False` (an attached run's DDP, DP or FSDP on CUDA, issue 31.3) makes it
    None whatever figure the caller had in its place.

    `start` is the step's `now()` reading; it is reported as `start_ts` (unix seconds).
    """
    if extra.get("comm_exposed_measured") is False:
        comm_exposed_s = None
    return dict(loss=loss, samples=samples, step_time_s=step_time_s, forward_s=forward_s,
                backward_s=backward_s, comm_exposed_s=comm_exposed_s, optimizer_s=optimizer_s,
                samples_per_s=samples / step_time_s if step_time_s > 0 else 0.0,
                start_ts=wall_ts(start), **extra)
