"""Which kept step a one-step view opens on (Live's bucket and DP phase charts), and how it is named.

Pure: lists of events in, a step number or a caption out. The rule is `app.frames.steps.typical_step`
(nearest the median steady step time; never the traced final step for being the newest), the one
the Bucket timeline and DP timeline pages open on too.
"""

from __future__ import annotations

from typing import Iterable

from ddpviz.app.frames import buckets as fb
from ddpviz.app.frames import dp as fd
from ddpviz.app.frames import steps as fsteps
from ddpviz.app.frames.base import Event


def typical_detail_step(detail_events: Iterable[Event], step_events: Iterable[Event], type_: str) -> int | None:
    """The kept step a one-step chart of `type_` events ("bucket" or "dp_phase") shows: the typical
    step of those whose events are complete (buckets: `bucket_candidates`)."""
    events, steps_ev = list(detail_events), list(step_events)
    steps = bucket_candidates(events, steps_ev) if type_ == "bucket" else fd.dp_steps(events)
    return fsteps.typical_step(steps, steps_ev)


def bucket_candidates(bucket_events: list[Event], step_events: list[Event]) -> list[int]:
    """The kept steps a bucket view may open on, best first: ordinary (not instrumented) steps with
    measured spans; else ordinary steps (with bucket_timing=recorder only the profiled steps have
    spans, and they are instrumented: an ordinary step shows its ready times and exposed comm, its
    all-reduce "not measured", issue 33); else any step with spans; else any kept step. A step
    is not ordinary when its step events say so (instrumented) or its bucket events do (sampled):
    the latter still tell once a long run's window has let the step's own events go (Live, past
    its 500 steps, opened on "Step 1 (sampled)", seen in Chromium)."""
    notes = fsteps.step_notes(step_events, bucket_events)
    measured, kept = fb.measured_steps(bucket_events), fb.bucket_steps(bucket_events)

    def ordinary(steps: list[int]) -> list[int]:
        return [s for s in steps if s not in notes]
    return ordinary(measured) or ordinary(kept) or measured or kept


def step_text(step: int, step_events: Iterable[Event], detail_events: Iterable[Event] = ()) -> str:
    """"Step 41 (typical: nearest the median step time)", or the word `fsteps.step_notes` gives it."""
    step_events = list(step_events)
    note = fsteps.step_notes(step_events, detail_events).get(step)
    if note == "instrumented":
        return f"Step {step} (instrumented: its time includes the instrument's own work)"
    gap = None if note else fsteps.typical_gap(step, step_events)
    if gap:  # the kept steps were all far from the median: say so, with both times
        return (f"Step {step} (of the kept steps, the nearest the median step time: {gap[0] * 1e3:.1f} ms "
                f"against the run's median {gap[1] * 1e3:.1f} ms)")
    return f"Step {step} ({note or 'typical: nearest the median step time'})"
