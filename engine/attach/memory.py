"""The memory sampler and live-tensor ledger of an attached run, as a launched DDP rank has them
(`engine.measure.memory_sampler`): a timer reading the process's memory 20 times a second, and on
sampled steps (`should_trace_memory` with `STEPS_HINT`, since the script's step count is not
known ahead: steps 0-2 and every 200th) the ledger traces every tensor storage from the step's
first forward to its optimizer step's end. Those steps' `step` events carry `memory_traced`.

Built at the first step of the first watched module (a DDP, or a model `ddpviz.watch()` registered):
its module and device are then known.
"""

from __future__ import annotations

from typing import Any

from ddpviz.engine.attach.session import Session
from ddpviz.engine.measure.ledger import TensorLedger
from ddpviz.engine.measure.memory import optimizer_state_tensors
from ddpviz.engine.measure.memory_sampler import DeviceProbe, MemorySampler, phase_hooks, should_trace_memory

# What should_trace_memory is told the run's length is: steps 0-2 and every 200th. A traced step costs
# ~3x an untraced one (engine.measure.memory_sampler), so 1 in 200 adds ~1% to a long run's time.
STEPS_HINT = 4000


class MemoryWatch:
    """Starts the sampler, and opens and closes a traced step around the steps it picks."""

    def __init__(self, s: Session, tracker: Any):
        self.s, self.tracker = s, tracker
        self.sampler: MemorySampler | None = None
        self.optimizers: list[Any] = []
        self._open: Any = None
        self.model = None

    def _build(self, watch: Any) -> None:
        model, device = watch.module, watch.device
        self.model = model
        ledger = TensorLedger(1, device_type=device.type)

        def existing():
            out = [(0, "params", model.parameters()), (0, "buffers", model.buffers()),
                   (0, "grads", [p.grad for p in model.parameters()])]
            return out + [(0, "optimizer_state", optimizer_state_tensors(o)) for o in self.optimizers]

        probe = DeviceProbe(self.s.tel.device, ledger_index=0,
                            cuda_index=(device.index or 0) if device.type == "cuda" else None)
        self.sampler = MemorySampler(self.s.tel, [probe], STEPS_HINT, ledger=ledger, existing=existing,
                                     hooks=lambda: _phase_hooks(ledger, model))

    def step_start(self, step: int, watch: Any) -> None:
        """At the first forward of `step`: trace it if it is a sampled step."""
        if self.sampler is None:
            self._build(watch)
        if should_trace_memory(step, STEPS_HINT):
            cm = self.sampler.traced(step)
            cm.__enter__()
            self._open = cm

    def optimizer_seen(self, opt: Any) -> None:
        if all(o is not opt for o in self.optimizers):
            self.optimizers.append(opt)
        if self._open is not None and self.sampler is not None and self.sampler.ledger is not None:
            self.sampler.ledger.set_kind("optimizer")

    def step_end(self, fields: dict) -> None:
        """Close the traced step (emits its `memory` events); marks `fields` as traced."""
        cm, self._open = self._open, None
        if cm is None:
            return
        self.sampler._last_fields = fields
        fields["memory_traced"] = True
        cm.__exit__(None, None, None)

    def abandon(self) -> None:
        cm, self._open = self._open, None
        if cm is not None:
            cm.__exit__(RuntimeError, RuntimeError("abandoned"), None)

    def close(self) -> None:
        """At exit: the sampler stops, and the script's model and optimizers are let go."""
        self.abandon()
        if self.sampler is not None:
            self.sampler.close()
        self.sampler, self.model, self.optimizers = None, None, []


def _phase_hooks(ledger: TensorLedger, model: Any):
    """`engine.measure.memory_sampler.phase_hooks` without an optimizer handle (the script's is
    known only once it steps; `MemoryWatch.optimizer_seen` names what the optimizer makes)."""
    return phase_hooks(ledger, model, None, first_kind=None)
