"""`RunWindow`: the bounded, incrementally read view of one run's event stream.

The Live page keeps one `RunWindow` per run in `st.session_state`. Each `poll` reads only the
events after the last stream id it saw (`DdpvizClient.read_events`) and keeps bounded windows:
the last `max_steps` steps of `step`/`memory` events, every `eval`, the last 50 `log`; of the
per-step detail events (`bucket`/`dp_phase`/`comm_volume`/FSDP's) the same steps on every page
(`DETAIL_FIRST_STEPS` for good: step 0's single DDP bucket, the rebuild after it; the newest
`DETAIL_RECENT_STEPS`; and one step in every `spread_stride`, across the whole run), so a one-step
view (Live's, the Bucket and DP timelines) opens on a typical step of the run, not of its last
seconds, and every page picks the same one (`app.frames.steps.typical_step`, issue 33);
the memory timer's readings (`memory_readings`) are folded into `memory_history` as they arrive.
Once the run is terminal and its stream is drained, `done` is True and polling stops. Steps that
leave the window are folded into `history` (`app.step_history`), so Live still draws the whole run.

Opening a long run reads windows, not the whole stream: the first poll reads the stream's head
(`run_started`, the first steps) and then only its tail, about as many events as the window keeps
(`max_steps` steps, at the event density the head showed), with the client's `read_tail`; the
events in between are read by the polls after it (`max_batches` a poll, as the tail's new events),
folded straight into `history` and `memory_history` (their steps and readings only), so the whole
run fills in within a few refreshes; until then `unread_steps` says which steps are missing, so a
chart leaves them blank and says so instead of drawing across them. So opening a run of 100 K
events costs about what opening one of 10 K does (`ddpviz bench`, figure 4); the middle is read
afterwards, a poll at a time.
"""

from __future__ import annotations

import contextlib
import gc
import json
import threading
import time
from typing import Any, Iterator, Protocol

from ddpviz.app.step_history import ReadingHistory, StepHistory
from ddpviz.engine.result import TERMINAL as _TERMINAL
from ddpviz.workers.history import trimmed_before

TERMINAL = tuple(s.value for s in _TERMINAL)  # lost: its worker stopped beating
DETAIL_TYPES = ("bucket", "dp_phase", "comm_volume", "fsdp_collective", "fsdp_memory_curve")
DETAIL_RECENT_STEPS = 8  # newest steps of the detail types kept per run
DETAIL_FIRST_STEPS = 2  # steps 0 and 1 as well: the initial bucket and the rebuilt layout
SPREAD_STEPS = 12  # at most this many steps kept across the run besides (`spread_stride`)
SPREAD_MIN_STRIDE = 8
_MAX_LOGS = 50
TAIL_MAX_EVENTS = 10_000  # events a first poll reads from a stream's tail, at most


_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = True
_gc_off_since = 0.0
GC_MAX_OFF_S = 2.0  # readers that overlap without end still let a collection run this often


def spread_stride(newest: int, spread: int = SPREAD_STEPS) -> int:
    """The stride of the detail steps a window keeps across a run whose newest step is `newest`:
    the smallest power of two, at least `SPREAD_MIN_STRIDE`, that keeps at most `spread` steps
    (multiples of it in 0..newest). A power of two, so a step kept at a larger stride was kept at
    every smaller one: a window never needs a step it dropped, and two windows that have read up
    to the same step keep the same ones. E.g. newest 299: 32 (0, 32, ..., 288: 10 steps)."""
    stride = SPREAD_MIN_STRIDE
    while newest // stride + 1 > spread:
        stride *= 2
    return stride


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a window reads and decodes a batch of events.

    Decoding thousands of events allocates hundreds of thousands of dicts and strings, which
    triggers collections, and each full collection scans every object the process holds (the
    open pages' windows too). Events are acyclic (freed by reference counting), so nothing
    is lost by pausing; the collector runs again after. Measured on this machine, three 100 K
    event runs opened 4 times each with earlier windows held: open median 156-222 ms with the
    collector on, 88-92 ms paused. Process-wide and counted: the collector comes back on when
    the last of concurrent readers (Streamlit sessions are threads) leaves, if it was on; while
    readers keep overlapping, one leaving runs a full collection every `GC_MAX_OFF_S`.
    """
    global _gc_pausers, _gc_was_enabled, _gc_off_since
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            _gc_off_since = time.monotonic()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        collect = False
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()
            elif _gc_pausers and _gc_was_enabled and time.monotonic() - _gc_off_since > GC_MAX_OFF_S:
                _gc_off_since, collect = time.monotonic(), True
        if collect:  # other readers keep it paused: collect now, once per GC_MAX_OFF_S
            gc.collect()


class EventReader(Protocol):
    """The part of `workers.client.DdpvizClient` a window needs."""

    def read_events(self, run_id: str, after_id: str = "0-0", count: int = 2000
                    ) -> tuple[list[dict[str, Any]], str]: ...

    def get_run(self, run_id: str) -> dict[str, Any] | None: ...

    # optional: `read_tail(run_id, after_id, count) -> (events, last_id)`, the newest `count`
    # events after `after_id`, oldest first (DdpvizClient has it; without it a window reads all)


class RunWindow:
    """Bounded recent events of one run.

    Args:
        run_id: the run to follow.
        max_steps: optimizer steps of `step` and `memory` events kept (older ones are dropped).
        batch: events per `read_events` call; `max_batches` calls per poll at most, so a long
            finished run is caught up over a few polls instead of blocking one.
        recent_steps: newest steps kept of the per-step detail types (`DETAIL_TYPES`).
        first_steps: steps ``0 .. first_steps-1`` of those types are kept as well.
        spread: besides, at most this many steps of those types across the run (`spread_stride`).
    """

    def __init__(self, run_id: str, max_steps: int = 500, batch: int = 2000, max_batches: int = 5,
                 recent_steps: int = DETAIL_RECENT_STEPS, first_steps: int = DETAIL_FIRST_STEPS,
                 spread: int = SPREAD_STEPS):
        self.run_id = run_id
        self.max_steps, self.batch, self.max_batches = max_steps, batch, max_batches
        self.recent = {t: recent_steps for t in DETAIL_TYPES}
        self.first_steps, self.spread = first_steps, spread
        self.last_id = "0-0"
        self.run: dict[str, Any] | None = None  # latest get_run() record
        self.started: dict[str, Any] | None = None
        self.finished: dict[str, Any] | None = None
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.latest_step = -1
        self.done = False
        self.polled_at = 0.0  # time.monotonic() of the last poll
        self.history = StepHistory()  # throughput of the steps dropped from the window, binned
        self.memory_history = ReadingHistory()  # every memory timer reading read, binned by time
        self.unread_steps: tuple[int, int] | None = None  # (first, last) step `_open` skipped, not yet read
        # the first step the stream still holds when Redis trimmed its head (XADD MAXLEN: the stream keeps the
        # newest `workers.sink.DEFAULT_STREAM_MAXLEN` events; a 64-device DP run of 300 steps lost steps 0-95)
        self.trimmed_before: int | None = None
        self._gap: dict[str, Any] | None = None  # where the skipped middle's reading stands

    # ---- reading ---------------------------------------------------------------------------
    def poll(self, client: EventReader, min_interval_s: float = 0.0) -> int:
        """Read new events and refresh the run record; returns how many events arrived.

        Several panels share one window; `min_interval_s` lets all but the first skip the read.
        """
        if self.done or time.monotonic() - self.polled_at < min_interval_s:
            return 0
        self.polled_at = time.monotonic()
        with gc_paused():
            return self._read(client)

    def _read(self, client: EventReader) -> int:
        self.run = client.get_run(self.run_id) or self.run
        if self.started is None:  # the record keeps run_started; a long run's stream trims it
            self.started = (self.run or {}).get("started")
        terminal = self.status in TERMINAL
        got, batches = 0, self.max_batches
        if self.last_id == "0-0":
            got, caught_up = self._open(client)
            batches -= 1
            if caught_up:  # the head held the whole stream
                self.done = terminal
                return got
        elif self._gap is not None:
            got += self._read_gap(client)
        for _ in range(batches):
            events, last_id = client.read_events(self.run_id, after_id=self.last_id,
                                                 count=self.batch)
            self.ingest(events)
            self.last_id = last_id or self.last_id
            got += len(events)
            if len(events) < self.batch:
                # status was read before the stream: a terminal run has written all its events
                self.done = terminal and self._gap is None
                break
        return got

    def _open(self, client: EventReader) -> tuple[int, bool]:
        """First read: the stream's head, then (if there is more) only its tail; the middle is
        left to the next polls (`_read_gap`).

        Returns:
            (events read, whether the head held the whole stream).
        """
        head, last_id = client.read_events(self.run_id, after_id="0-0", count=self.batch)
        self.trimmed_before = trimmed_before(head)
        self.ingest(head)
        self.last_id = last_id or self.last_id
        read_tail = getattr(client, "read_tail", None)
        if len(head) < self.batch or read_tail is None:
            return len(head), len(head) < self.batch
        steps_seen = len({e["step"] for e in head if isinstance(e.get("step"), int)}) or 1
        want = min(TAIL_MAX_EVENTS, self.batch + len(head) * (self.max_steps + 1) // steps_seen)
        tail, tail_id = read_tail(self.run_id, after_id=self.last_id, count=want)
        head_steps = [e["step"] for e in head if e.get("type") == "step" and isinstance(e.get("step"), int)]
        tail_steps = [e["step"] for e in tail if e.get("type") == "step" and isinstance(e.get("step"), int)]
        if head_steps and tail_steps and min(tail_steps) > max(head_steps) + 1:
            first, last = max(head_steps), min(tail_steps)
            self.unread_steps = (first + 1, last - 1)
            readings = [t for e in tail if e.get("type") == "memory_readings" for t in e.get("reading_ts") or []]
            # the steps either side of the middle may be cut in two (one rank's event each side):
            # both are left to `_read_gap`, which reads them whole
            kept = self.events.get("step", [])
            self._gap = {"after_id": self.last_id, "first_step": first, "last_step": last,
                         "below_ts": min(readings) if readings else float("inf"),
                         "held": [e for e in kept if e.get("step") == first]}
            kept[:] = [e for e in kept if e.get("step") != first]
            tail = [e for e in tail if not (e.get("type") == "step" and e.get("step") == last)]
        self.ingest(tail)
        self.last_id = tail_id or self.last_id
        return len(head) + len(tail), False

    def _read_gap(self, client: EventReader) -> int:
        """Read on through the middle `_open` skipped, `max_batches` batches at most: fold its steps
        from the head's last to the tail's first, each whole (`history`), and its memory readings
        older than the tail's (`memory_history`); nothing else is kept (the windows hold the newest
        steps already). Done once a step past the tail's first is met: every rank's event of the
        steps before it has been read (ranks write a step's events about together)."""
        gap, got = self._gap, 0
        for _ in range(self.max_batches):
            events, last_id = client.read_events(self.run_id, after_id=gap["after_id"], count=self.batch)
            got += len(events)
            gap["after_id"] = last_id or gap["after_id"]
            steps = gap.pop("held", []) + [e for e in events
                                           if e.get("type") == "step" and isinstance(e.get("step"), int)]
            for e in events:
                if e.get("type") == "memory_readings" and max(e.get("reading_ts") or [0]) < gap["below_ts"]:
                    self.memory_history.add(e)
            self._keep_spread(events, gap["first_step"], gap["last_step"])
            end = len(events) < self.batch or any(e["step"] > gap["last_step"] for e in steps)
            newest = max((e["step"] for e in steps), default=None)
            if not end:  # the newest step's other ranks may come in the next batch: fold it whole, then
                gap["held"] = [e for e in steps if e["step"] == newest]
                steps = [e for e in steps if e["step"] != newest]
            self.history.add(e for e in steps if gap["first_step"] <= e["step"] <= gap["last_step"])
            if end:
                self._gap, self.unread_steps = None, None
                break
        return got

    def _keep_spread(self, events: list[dict[str, Any]], first_step: int, last_step: int) -> None:
        """Keep the detail events of the spread steps (`spread_stride`) between `first_step` and
        `last_step` that the gap holds, as a read of the whole stream would have; a step cut between
        the head or the tail and the gap is completed, nothing kept twice."""
        stride = spread_stride(self.latest_step, self.spread)
        for t in self.recent:
            new = [e for e in events if e.get("type") == t and isinstance(e.get("step"), int)
                   and first_step <= e["step"] <= last_step and not e["step"] % stride]
            if not new:
                continue
            kept = self.events.setdefault(t, [])
            seen = {json.dumps(e, sort_keys=True, default=str) for e in kept
                    if first_step <= e.get("step", -1) <= last_step}
            for e in new:
                key = json.dumps(e, sort_keys=True, default=str)
                if key not in seen:
                    seen.add(key)
                    kept.append(e)
            kept.sort(key=lambda e: e.get("step", 0))  # stable: a step's events stay in the order read

    def ingest(self, events: list[dict[str, Any]]) -> None:
        """Add events (in stream order) and trim the windows."""
        by_type, latest = self.events, self.latest_step  # locals: this loop sees every event read
        for e in events:
            t = e.get("type")
            if t == "run_started":
                self.started = e
            elif t == "run_finished":
                self.finished = e
            elif t == "memory_readings":  # binned, never kept: a reading a device takes 20 times a second
                self.memory_history.add(e)
            else:
                kept = by_type.get(t)
                if kept is None:
                    kept = by_type[t] = []
                kept.append(e)
                step = e.get("step")
                if type(step) is int and step > latest and t != "eval":
                    latest = step
        self.latest_step = latest
        self._trim()

    def _trim(self) -> None:
        for t, evs in self.events.items():
            if t == "log":
                del evs[:-_MAX_LOGS]
                continue
            if t == "eval" or not evs:
                continue
            newest = max(e.get("step", 0) for e in evs[-64:])
            keep = self.recent.get(t, self.max_steps)
            stale = [e.get("step", 0) for e in evs]
            if t in self.recent:  # detail: the first steps, one in every `stride`, the newest
                first, stride = self.first_steps, spread_stride(newest, self.spread)
                if any(first <= st <= newest - keep and st % stride for st in stale):
                    evs[:] = [e for e, st in zip(evs, stale) if st > newest - keep or st < first or not st % stride]
            elif any(st <= newest - keep for st in stale):
                if t == "step":  # the whole run stays on the Live chart, in bins
                    self.history.add(e for e, st in zip(evs, stale) if st <= newest - keep)
                evs[:] = [e for e, st in zip(evs, stale) if st > newest - keep]

    # ---- views -----------------------------------------------------------------------------
    def of_type(self, type_: str) -> list[dict[str, Any]]:
        return self.events.get(type_, [])

    @property
    def status(self) -> str:
        """queued|started|finished|failed|canceled, or 'unknown' before the first poll."""
        return (self.run or {}).get("status", "unknown")

    @property
    def config(self) -> dict[str, Any]:
        return (self.run or {}).get("config") or (self.started or {}).get("config") or {}

    @property
    def mode(self) -> str:
        return self.config.get("mode", "?")

    @property
    def steps_total(self) -> int:
        return int(self.config.get("steps") or 0)

    @property
    def summary(self) -> dict[str, Any]:
        """The run's summary (its record's, or its `run_finished` event's); {} before it has one."""
        return (self.run or {}).get("summary") or (self.finished or {}).get("summary") or {}

    @property
    def steps_done(self) -> int:
        """Optimizer steps completed (from step events, or the summary once finished)."""
        return max(self.latest_step + 1, int(self.summary.get("steps_done") or 0))

    @property
    def error(self) -> dict[str, Any] | None:
        """``{rank, exception, traceback}`` of a failed run, from its record or its last event."""
        return (self.run or {}).get("error") or (self.finished or {}).get("error")

    @property
    def start_ts(self) -> float | None:
        return (self.started or {}).get("ts")
