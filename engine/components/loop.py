"""The step loop every mode shares: stop checks, step events, evaluation, memory samples.

A mode supplies `train_step(step) -> dict` (the `step` event's measures, see `step_fields`) and
optional callbacks; `drive` does the rest, so single, DP and each DDP rank report identically. A
step whose figures are still on the GPU (single, DP or a DDP rank on CUDA) returns None and queues them in
`later` (`engine.measure.deferred.DeferredSteps`); `drive` emits each once it completed, in order.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any, Callable, Iterable

from ddpviz.engine.components.training import should_eval
from ddpviz.engine.config import RunConfig
from ddpviz.engine.events import nonfinite_name
from ddpviz.engine.measure.deferred import FAULT_WAIT_S, DeferredSteps
from ddpviz.engine.measure.telemetry import Telemetry, should_sample_memory
from ddpviz.engine.measure.turns import gate_from_env


class Canceled(Exception):
    """The run was asked to stop (`should_stop()` returned True)."""


class NonFiniteLoss(ArithmeticError):
    """A step's loss is NaN or ±inf (message "loss is nan" / "loss is inf"); `.step` is that step.

    Plain PyTorch trains on silently (every later parameter is NaN); the run fails at the first
    such step instead, in every mode, after that step's event is emitted.
    """


def check_loss(fields: dict[str, Any], step: int) -> None:
    """Raise `NonFiniteLoss` when the step's `loss` (this rank's, or DP/single's global one) is
    NaN or ±inf (`engine.events.mark_nonfinite` names it the same way in the event)."""
    loss = fields.get("loss")
    if isinstance(loss, float) and not math.isfinite(loss):
        exc = NonFiniteLoss(f"loss is {nonfinite_name(loss)} at step {step}")
        exc.step = step
        raise exc


def drive(cfg: RunConfig, tel: Telemetry, train_step: Callable[[int], dict[str, Any]], *,
          should_stop: Callable[[], bool] | None = None,
          evaluate: Callable[[], tuple[float, float]] | None = None,
          memory: Callable[[int], None] | None = None,
          check_sync: Callable[[int], None] | None = None,
          first_step: int = 0,
          emit_step: Callable[[int, dict[str, Any]], None] | None = None,
          later: DeferredSteps | None = None) -> int:
    """Run steps `first_step..cfg.steps-1`; returns the number of steps done. `emit_step(step, fields)`
    sends each `step` event (default `tel.emit("step", step=step, **fields)`): a mode that hands a
    step's events over together (the DDP rank's steps) passes its own. With `later`, a `train_step`
    that returns None has queued its step there: its event is sent once it completed, after every
    earlier step's and before any later one's (`completed()` after each step; every queued one, waiting,
    before a step that returns its fields, before an evaluation, after the last step, on a cancel and, for
    at most `FAULT_WAIT_S`, when a step raised; a step that synchronised may `later.flush()` them first).

    Raises:
        Canceled: when `should_stop()` turns True between steps (the queued steps' events sent first).
        NonFiniteLoss: a step's loss is NaN or ±inf (its `step` event is emitted first).
        StepLate: a queued step never completed on the device (`DeferredSteps`).
        Exception: whatever a step raised, with `.step` set to that step (for the run's error).
    """
    gate = gate_from_env(tel.run_id, tel.rank)  # None except under a turn-taking harness (engine.measure.turns)
    try:
        _steps(cfg, tel, train_step, gate, should_stop, evaluate, memory, check_sync, first_step,
               emit_step or (lambda step, fields: tel.emit("step", step=step, **fields)), later)
    except BaseException:
        if gate is not None:  # leave the turns now, so the other side need not wait for this process to exit
            gate.close()
        raise
    if gate is not None:
        gate.at_end()
    return cfg.steps - first_step


def _steps(cfg: RunConfig, tel: Telemetry, train_step, gate, should_stop, evaluate, memory, check_sync,
           first_step: int, emit_step, later: DeferredSteps | None) -> None:
    def send(ended: Iterable[tuple[int, dict[str, Any]]]) -> None:
        for s, f in ended:
            emit_step(s, f)
            check_loss(f, s)

    if later is not None:
        later.bind(send)
    for step in range(first_step, cfg.steps):
        if gate is not None:
            gate.at_step(step)
        if should_stop is not None and should_stop():
            if later is not None:
                send(later.rest())
            raise Canceled(f"canceled before step {step}")
        try:
            fields = train_step(step)
        except Exception as exc:
            if getattr(exc, "step", None) is None:
                exc.step = step
            if later is not None:  # the steps before it still say what they measured, once they completed
                with contextlib.suppress(Exception):
                    send(later.rest(FAULT_WAIT_S))
            raise
        if later is not None:
            send(later.completed() if fields is None else later.rest())
        if fields is not None:
            emit_step(step, fields)
            check_loss(fields, step)
        if memory is not None and should_sample_memory(step, cfg.steps):
            memory(step)
        if should_eval(cfg, step):
            if later is not None:  # every step so far sent before the evaluation's and the check's events
                send(later.rest())
            if evaluate is not None:
                val_loss, val_acc = evaluate()
                tel.emit("eval", step=step, val_loss=val_loss, val_accuracy=val_acc)
            if check_sync is not None:
                check_sync(step)
        if cfg.step_delay_s:
            time.sleep(cfg.step_delay_s)
    if later is not None:
        send(later.rest())
