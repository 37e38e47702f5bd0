"""Bookkeeping of one DP step, kept apart from CUDA so it can be checked on any machine.

A DP step on real GPUs is measured with marks (CUDA events) recorded on each device's own stream,
inside the threads and autograd callbacks where that device's work is queued (`engine.modes.dp.hooks`).
This module turns those marks into `dp_phase` spans and sums them, and counts the bytes of the
tensors each device really sent or received through device 0 (the hub of DP's star):

- `SpanBook`: start/end marks per (phase, device, micro-step) -> spans in seconds. With
  `grad_accum_steps > 1` every micro-step keeps its own spans; the step's figures are their sum.
- `phase_seconds`: a device's time in some phases, summed over micro-steps.
- `StarTraffic`: bytes per device and per span from the tensors handed to each copy.

Phases and their order follow `torch.nn.DataParallel.forward` (torch/nn/parallel/data_parallel.py)
and the backward of `Broadcast` (torch/nn/parallel/_functions.py), as in `engine.modes.dp.emulated`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, NamedTuple, Sequence

PHASES = ("broadcast", "scatter", "forward", "gather", "loss", "backward", "reduce", "optimizer")
COMM_PHASES = ("broadcast", "scatter", "gather", "reduce")  # device 0's time in these = exposed comm


class Span(NamedTuple):
    """One phase on one device in one micro-step; seconds from the step's start on that device."""

    phase: str
    device: int
    micro: int
    start_s: float
    end_s: float


class SpanBook:
    """Start and end marks of DP phases, keyed by (phase, device, micro-step).

    A mark is opaque here (a CUDA event, or a host clock reading); `resolve` turns marks into
    seconds with the clock that made them. `start` keeps the first mark given for a key and `end`
    the last, so a callback that fires once per parameter (the end of a replica's backward) can
    call `end` every time and the latest one wins. Keys of different devices are written from
    different threads; each key is written by one thread only.
    """

    def __init__(self) -> None:
        self._marks: dict[tuple[str, int, int], list[Any]] = {}

    def start(self, phase: str, device: int, micro: int, mark: Any) -> None:
        slot = self._marks.setdefault((phase, device, micro), [None, None])
        if slot[0] is None:
            slot[0] = mark

    def end(self, phase: str, device: int, micro: int, mark: Any) -> None:
        self._marks.setdefault((phase, device, micro), [None, None])[1] = mark

    def resolve(self, seconds: Callable[[int, Any], float]) -> list[Span]:
        """Spans ordered by micro-step, phase order (`PHASES`) and device.

        Args:
            seconds: ``seconds(device, mark)`` -> seconds from that device's step origin.

        Raises:
            ValueError: a key has a start but no end (or the reverse): a callback that should
                have fired did not, so the step's figures would be wrong.
        """
        spans = []
        for (phase, device, micro), (a, b) in self._marks.items():
            if a is None or b is None:
                missing = "start" if a is None else "end"
                raise ValueError(f"dp phase {phase!r} on device {device}, micro-step {micro} "
                                 f"has no {missing} mark")
            spans.append(Span(phase, device, micro, seconds(device, a), seconds(device, b)))
        order = {p: i for i, p in enumerate(PHASES)}
        return sorted(spans, key=lambda s: (s.micro, order.get(s.phase, len(order)), s.device))


def phase_seconds(spans: Iterable[Span], phases: Sequence[str], device: int = 0) -> float:
    """Seconds `device` spent in `phases`, summed over every micro-step of the step."""
    return sum(s.end_s - s.start_s for s in spans if s.device == device and s.phase in phases)


def unique_tensors(tensors: Iterable[Any]) -> list[Any]:
    """`tensors` without None and without repeats of the same object (tied weights appear in two
    modules of a replica but are one copy), first occurrence kept."""
    seen: set[int] = set()
    out = []
    for t in tensors:
        if t is not None and id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def tensor_nbytes(tensors: Iterable[Any]) -> int:
    """Sum of numel * element_size over the distinct tensors (see `unique_tensors`)."""
    return sum(t.numel() * t.element_size() for t in unique_tensors(tensors))


class StarTraffic:
    """Bytes each of `n` devices sent and received through the hub (device 0) in one step.

    Counts come from the tensors each copy was handed (`tensor_nbytes`): what arrived on device j
    in a copy from the hub (broadcast, scatter, the output gradients scattered back in backward),
    or left device j for the hub (gather, the gradient reduce). The hub's own part of a split or a
    broadcast is not a copy and counts nothing; so with one device nothing moves.

    `span_nbytes[(phase, device, micro)]` is the `dp_phase` event's `nbytes`: on the hub, all it
    sent or received in that phase; on device j, its own part (as `engine.modes.dp.emulated` reports on CPU).
    """

    def __init__(self, n: int, hub: int = 0):
        if not 0 <= hub < n:
            raise ValueError(f"hub must be in [0, {n}) (got {hub})")
        self.n, self.hub = n, hub
        self.sent = [0] * n
        self.recv = [0] * n
        self.span_nbytes: dict[tuple[str, int, int], int] = {}

    def _check(self, per_device: Sequence[int]) -> None:
        if len(per_device) != self.n:
            raise ValueError(f"need one byte count per device ({self.n}), got {len(per_device)}")

    def _spans(self, phase: str | None, micro: int, per_device: Sequence[int], total: int) -> None:
        if phase is None:  # counted in the totals, drawn in no phase (as on CPU)
            return
        for j, nb in enumerate(per_device):
            key = (phase, j, micro)
            self.span_nbytes[key] = self.span_nbytes.get(key, 0) + (total if j == self.hub else nb)

    def from_hub(self, phase: str | None, micro: int, per_device: Sequence[int]) -> None:
        """Copies from the hub: `per_device[j]` bytes arrived on device j (the hub's entry is
        ignored: it keeps its own tensors)."""
        self._move(phase, micro, per_device, spokes=self.recv, hub=self.sent)

    def to_hub(self, phase: str | None, micro: int, per_device: Sequence[int]) -> None:
        """Copies into the hub: `per_device[j]` bytes left device j (the hub's entry is ignored)."""
        self._move(phase, micro, per_device, spokes=self.sent, hub=self.recv)

    def _move(self, phase: str | None, micro: int, per_device: Sequence[int], spokes: list[int],
              hub: list[int]) -> None:
        """Count one star copy: each spoke's bytes into `spokes[j]`, their sum into `hub[self.hub]`."""
        self._check(per_device)
        moved = [0 if j == self.hub else nb for j, nb in enumerate(per_device)]
        total = sum(moved)
        for j, nb in enumerate(moved):
            spokes[j] += nb
        hub[self.hub] += total
        self._spans(phase, micro, moved, total)


def theory_star_bytes(n: int, param_bytes: int, hub: int = 0) -> list[int]:
    """The DP formula of docs/events.md (`comm_volume`) per optimizer step and micro-step: the
    hub sends (broadcast) and receives (reduce) (n-1)·P; every other device P. Theory, not a
    measurement."""
    return [param_bytes * (n - 1) if j == hub else param_bytes for j in range(n)]
