"""What an attached process's `step` event says, and an ordinary step's events built from its readings
(docs/events.md, "attached runs"; the step machinery: `engine.attach.steps.StepTracker`).

`attached_fields` is the one assembly of a step's fields, for the steps `StepTracker._emit_step` writes on the
script's thread and for the ordinary ones `ordinary_events` writes on the event writer's thread
(`StepTracker._ordinary`); each `*_SOURCE` names how a field was measured.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from ddpviz.engine.events import mark_nonfinite
from ddpviz.engine.measure.telemetry import step_fields, wall_ts

SAMPLES_SOURCE = "batch dimension of the first tensor the DDP module received, summed over micro-steps, x world_size"
EXPLICIT_SAMPLES_SOURCE = "ddpviz.step(samples=...) of this rank, x world_size"
# no wrapped module's training forward in the step (a script without DDP, DP or FSDP): samples and samples/s are
# null, never 0 (before 2026-12-06 Live read "median samples/s 0" for such a run)
SAMPLES_NOT_SEEN = ("not seen: no DDP, DP or FSDP module's training forward in this step (give them with "
                    "ddpviz.step(samples=...))")
STEP_SOURCES = {False: "optimizer", True: "explicit"}  # by StepTracker.explicit
LOSS_SOURCE = "sum of the scalar tensors backward() was called on"
SCALED_LOSS_SOURCE = ("sum of the losses given to GradScaler.scale (unscaled; backward() got them "
                      "multiplied by the scaler's scale)")
EXPLICIT_LOSS_SOURCE = "ddpviz.step(loss=...)"
# a step whose backwards got no one-element tensor (`out.backward(gradient)` on a batch of outputs): no loss to read
LOSS_NOT_SEEN = ("not seen: backward() got no one-element tensor in this step (a backward of several outputs with "
                 "their own gradient); give it with ddpviz.step(loss=...)")


@functools.lru_cache(maxsize=64)
def ordinary_tail(micro_steps: int, explicit: bool, scaled: bool) -> dict[str, Any]:
    """An ordinary step's last fields: its `micro_steps`, every one before the last under no_sync, the step rule
    (`explicit` steps), the loss's source (`scaled`: from GradScaler.scale). One dict per key, never changed (callers
    pass it as ``**tail``)."""
    return dict(micro_steps=micro_steps, no_sync_micro_steps=micro_steps - 1, samples_source=SAMPLES_SOURCE,
                step_source=STEP_SOURCES[explicit], loss_source=SCALED_LOSS_SOURCE if scaled else LOSS_SOURCE)


def attached_fields(start: float, end: float, forward_s: float, forward_seen: bool, backward_s: float,
                    exposed_s: float, optimizer_s: float, samples: int | None, extra: dict[str, Any],
                    **tail: Any) -> dict[str, Any]:
    """An attached step's `step` event fields, the loss None: times in s from `now()` readings,
    `forward_s` null where no forward was seen (`forward_seen`), `samples` (all ranks) null where not seen, then
    samples/s too; `other_s` the step's time outside its measured phases; `extra` and `tail` as given."""
    step_time = end - start
    fields = step_fields(start=start, loss=None, samples=samples or 0, step_time_s=step_time,
                         forward_s=forward_s if forward_seen else None, backward_s=backward_s,
                         comm_exposed_s=exposed_s, optimizer_s=optimizer_s, **extra)
    if samples is None:
        fields.update(samples=None, samples_per_s=None)
    fields.update(other_s=max(0.0, step_time - forward_s - backward_s - exposed_s - optimizer_s), **tail)
    return fields


def ordinary_events(step_head: dict, bucket_heads: list[dict], volume_head: dict, exposed_of: Callable,
                    ts: float, step: int, readies: list[float], start: float, end: float, forward_s: float,
                    backward_s: float, t0: float, t1: float, optimizer_s: float, loss: float, samples: int,
                    tail: dict) -> list[dict]:
    """An ordinary step's events (`StepTracker._ordinary`), from its readings (s; `backward_s` Σ its micro-steps'
    backwards, `t0`/`t1` its synced backward's start and end): each bucket's (its head with the ready time), the
    step's comm_volume and its step event, as `_emit_step` writes them. Called on the event writer's thread
    (`engine.batching.Later`): it reads nothing that changes after the step."""
    events = [{**h, "ts": ts, "step": step, "ready_s": r} for h, r in zip(bucket_heads, readies)]
    exposed, extra = exposed_of(events, t1 - t0)
    fields = attached_fields(start, end, forward_s, True, backward_s - exposed, exposed, optimizer_s, samples,
                             dict(backward_start_ts=wall_ts(t0), **extra), **tail)
    fields["loss"] = loss
    events.append({**volume_head, "ts": ts, "step": step})
    events.append({**step_head, "ts": ts, "step": step, **(fields if loss - loss == 0 else mark_nonfinite(fields))})
    return events
