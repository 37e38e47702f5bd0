"""The GIL meter on a DDP rank's training thread: step-clock marks that also read the thread's
clocks on the metered steps (`MeteredClock`, gated by `engine.measure.gil.MeterGate`), and the
rank's `gil` event from them (`rank_step_fields`). The meter itself (clocks, spans, figures) is
`engine.measure.gil`.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from ddpviz.engine.measure.gil import MeterGate, Span, ThreadClocks, span_fields


class MeteredMark(NamedTuple):
    """A step clock's mark with the calling thread's clocks read beside it (None: a time-only
    mark, `MeteredClock.time_mark`)."""

    mark: object
    clocks: ThreadClocks | None


class MeteredClock:
    """Wraps a step clock (`engine.measure.clocks.StepClock`): `mark()` also reads the calling
    thread's clocks, `seconds`/`settle`/`done` are the wrapped clock's, so a rank's phase marks give
    both the phase's duration and its thread's lock wait (one reading per mark) — on the steps
    `gate` (a `MeterGate`, shared by a rank's clocks) has on; time-only marks on the others."""

    def __init__(self, clock, gate: MeterGate | None = None) -> None:
        self.clock, self.gate = clock, gate

    def mark(self) -> MeteredMark:
        return MeteredMark(self.clock.mark(), ThreadClocks.read() if self.gate is None or self.gate.on else None)

    def time_mark(self) -> MeteredMark:
        """A mark for its time only: no thread clocks read (`ThreadClocks.read` is ~2.6 µs of CPU,
        a syscall on /proc; marks whose spans no lock-wait figure uses skip it)."""
        return MeteredMark(self.clock.mark(), None)

    def settle(self) -> None:
        self.clock.settle()

    def seconds(self, origin: MeteredMark, mark: MeteredMark) -> float:
        return self.clock.seconds(origin.mark, mark.mark)

    def done(self, mark: MeteredMark) -> bool:
        return self.clock.done(mark.mark)


# what a rank's `gil` source says when its all-reducing backward is not metered (`engine.verdict` reads them)
CUDA_BACKWARD = "backward runs in autograd's device thread"
BACKWARD_LEFT_OUT = "the backward that all-reduces is left out"


def rank_step_fields(micro_marks: Sequence[tuple[MeteredMark, MeteredMark, MeteredMark]],
                     opt_marks: tuple[MeteredMark, MeteredMark], step_wall_s: float,
                     last_ready: MeteredMark | None, cuda: bool, note: str = "") -> dict:
    """The `gil` event of one DDP rank's step: its training thread in forward, backward and the
    optimizer (`span_fields`).

    Args:
        micro_marks: per micro-batch (forward start, backward start, backward end).
        opt_marks: (optimizer start, optimizer end).
        last_ready: the comm hook's mark when the step's last bucket became ready (read in this
            thread, which runs the hooks on CPU). After it the thread waits for the all-reduce,
            which is not lock wait: that part of the last backward is measured apart and reported
            as `other_wait_s`. None (no comm hook, bucket_timing=recorder: no mark in this thread)
            or a mark from another thread: the last backward's blocked time (mostly its wait for the
            all-reduce, in DDP's finalize) cannot be told from lock wait, so that backward is left
            out, as on CUDA (counted whole, it once made ~1 ms of all-reduce wait a step "GIL wait").
        cuda: on CUDA the backward runs in autograd's device thread while this one waits for it,
            so backward is left out (its wait is a hand-over, not a lock).
        note: appended to `source` (e.g. `MeterGate.note()`).

    Returns:
        `span_fields`'s figures, plus `phase_wait_s` (lock wait per phase: forward, backward,
        optimizer, seconds) where measured.
    """
    phases = {"forward": [Span(a.clocks, b.clocks) for a, b, _ in micro_marks],
              "optimizer": [Span(opt_marks[0].clocks, opt_marks[1].clocks)], "backward": []}
    other, split = 0.0, False
    if not cuda:
        phases["backward"] = [Span(b.clocks, c.clocks) for _, b, c in micro_marks[:-1]]  # no_sync: no all-reduce
        _, b, c = micro_marks[-1]
        split = last_ready is not None and last_ready.clocks.native_id == b.clocks.native_id
        if split:
            phases["backward"].append(Span(b.clocks, last_ready.clocks))  # type: ignore[union-attr]
            other = Span(last_ready.clocks, c.clocks).blocked_s or 0.0  # type: ignore[union-attr]
    spans = [s for group in phases.values() for s in group]
    note = (f"; DDP rank: the training thread in forward and the optimizer (CUDA: {CUDA_BACKWARD})" if cuda else
            f"; DDP rank: the training thread in forward and the optimizer; {BACKWARD_LEFT_OUT} (no ready mark "
            "in this thread: no comm hook, bucket_timing=recorder; its wait for the all-reduce cannot be told "
            "apart from lock wait)" if not split else
            "; DDP rank: the training thread in forward, the optimizer and backward up to its last "
            "bucket's ready mark; blocked after it, waiting for the all-reduce, is other_wait_s") + note
    out = span_fields(spans, step_wall_s, note=note)
    if out["gil_wait_s"] is not None:
        out["other_wait_s"] = other
        out["thread_wait_s"] = max(0.0, out["thread_wait_s"] - other)
        out["phase_wait_s"] = {p: sum(s.blocked_s or 0.0 for s in group) for p, group in phases.items() if group}
    return out
