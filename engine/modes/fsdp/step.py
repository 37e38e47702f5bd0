"""One FSDP rank's training step and its sampled-step events (used by `engine.modes.fsdp.rank`).

Every step: forward and backward through the FSDP2 model, optimizer step on the local shards,
the collectives' spans kept by `CollectiveLog` (a few clock marks per collective), and the
`step` event. Sampled steps (`sample_step`: steps 0-2, every max(10, steps // 20)-th and the
last, so about 20 per run) also emit every `fsdp_collective` and the `comm_volume`, after the
step's clock stops. Memory is traced on DDP's traced steps (`should_trace_memory`, by the
sampler `engine.modes.fsdp.memory.fsdp_memory_sampler` wrapped around `train_step`): the ledger
over the whole step gives the `memory` event, and the hook-time curve by kind
(`FsdpMemoryProbe`) the `fsdp_memory_curve`. Those steps say `memory_traced: true`, and the
summary's medians leave them out, as DDP's.

Step split (CPU): FSDP2 issues gloo collectives with ``async_op=False`` on the training thread,
so time inside them is not compute: `forward_s` and `backward_s` are the wall time of each pass
minus the union of the collective spans in it, and `comm_exposed_s` is that union. On CUDA the
collectives run on FSDP2's comm streams and the host clock cannot tell exposed from hidden time:
`comm_exposed_s` is null (not measured), `forward_s`/`backward_s` are the passes' whole times
between CUDA events on the compute stream, and the step says `comm_exposed_measured: false`. The step
waits for the GPU once, at its end (`StepClock.settle`), and reads its loss after that.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn as nn

from ddpviz.engine.components.faults import maybe_diverge, maybe_fail
from ddpviz.engine.components.training import autocast, micro_loss
from ddpviz.engine.config import RunConfig
from ddpviz.engine.data import BatchPlan, Dataset
from ddpviz.engine.measure.clocks import StepClock
from ddpviz.engine.measure.telemetry import Telemetry, now, step_fields, wall_ts
from ddpviz.engine.modes.fsdp.collectives import CollectiveLog, exposed_comm_s, theory_bytes, volume_fields
from ddpviz.engine.measure.ledger import TensorLedger
from ddpviz.engine.measure.memory_sampler import should_trace_memory
from ddpviz.engine.modes.fsdp.memory import CURVE_SOURCE, FsdpMemoryProbe

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


def sample_step(step: int, steps: int) -> bool:
    """Steps that carry the memory curve and the collective events (about 20 per run)."""
    return step < 3 or step == steps - 1 or step % max(10, steps // 20) == 0


class StepRunner:
    """Holds one rank's FSDP training state; `train_step` is `engine.components.loop.drive`'s step function
    (it emits the sampled steps' memory itself, since its schedule is its own).
    `progress["step"]` is kept current for the rank's error report."""

    def __init__(self, cfg: RunConfig, rank: int, world: int, backend: str, device: torch.device,
                 ds: Dataset, model: nn.Module, units: list[tuple[str, nn.Module]], opt, log: CollectiveLog,
                 probe: FsdpMemoryProbe, tel: Telemetry, progress: dict):
        self.cfg, self.rank, self.world, self.backend, self.device = cfg, rank, world, backend, device
        self.ds, self.model, self.units, self.opt, self.log, self.probe = ds, model, units, opt, log, probe
        self.tel, self.progress = tel, progress
        self.plan = BatchPlan(len(ds), world, cfg.micro_batch_per_device, cfg.seed)
        numel = sum(p.numel() for p in model.parameters())  # DTensor numel is the full size
        gathers = cfg.grad_accum_steps * (2 if cfg.reshard_after_forward else 1)
        self.theory = theory_bytes(world, numel, reshard_after_forward=cfg.reshard_after_forward,
                                   gather_dtype_bytes=_DTYPE_BYTES[cfg.fsdp_param_dtype],
                                   reduce_dtype_bytes=_DTYPE_BYTES[cfg.fsdp_reduce_dtype],
                                   micro_batches=cfg.grad_accum_steps)
        self.formula = f"{gathers + 1}(n−1)/n·P" if cfg.grad_accum_steps == 1 else \
            f"({gathers} all-gathers + 1 reduce-scatter)·(n−1)/n·P"
        self.host_clock = device.type == "cpu"
        # the step's phases: host marks on CPU, CUDA events on CUDA, read after the step's one synchronize
        # (`StepClock.settle`: a synchronize per phase and a loss `.item()` per micro-batch would wait 4 times)
        self.clock = StepClock(device)
        self.ledger: TensorLedger | None = None  # the memory sampler's, set by the rank
        self.last_phases: list[tuple[str, float, float]] = []  # the last step's spans, perf_counter s
        for name, mod in units:  # after FSDP2's own pre-forward: the unit is unsharded here
            mod.register_forward_pre_hook(lambda *_a, _n=name: self.probe.point(f"unsharded {_n}", "forward"))
        log.on_open = self._on_open
        log.on_close = lambda rec: self.probe.point(f"{rec['kind']} end {rec['unit']}", rec["phase"])

    def _on_open(self, rec: dict, full: torch.Tensor) -> None:
        self.probe.note_comm_buffer(full)
        if self.ledger is not None and self.ledger.active:
            self.ledger.retag([full], "comm_buffers")
        self.probe.point(f"{rec['kind']} start {rec['unit']}", rec["phase"])

    def _micro(self, step: int, micro: int, sampled: bool, marks: list) -> torch.Tensor:
        """Forward and backward of one micro-batch; returns its loss (already / grad_accum_steps, detached,
        not read: reading it would wait for the GPU), and appends its (phase, start mark, end mark)."""
        cfg, last = self.cfg, micro == self.cfg.grad_accum_steps - 1
        idx = self.plan.rank_indices(step * cfg.grad_accum_steps + micro, self.rank)
        x, y = self.ds.x_train[idx].to(self.device), self.ds.y_train[idx].to(self.device)
        maybe_fail(cfg, self.rank, step)
        if cfg.grad_accum_steps > 1:  # reduce-scatter once per step, like DDP's no_sync
            self.model.set_requires_gradient_sync(last)
        self.log.phase = "forward"
        m1 = self.clock.mark()
        with (self.probe.acts.hooks() if sampled else contextlib.nullcontext()), autocast(cfg, self.device.type):
            loss = micro_loss(self.model(x), y, cfg.grad_accum_steps)
        m2 = self.clock.mark()
        self.probe.point("forward end", "forward")
        self.log.phase = "backward"
        loss.backward()
        m3 = self.clock.mark()
        self.log.phase = None
        marks += [("forward", m1, m2), ("backward", m2, m3)]
        return loss.detach()

    def train_step(self, step: int) -> dict[str, Any]:
        self.progress["step"] = step
        sampled = sample_step(step, self.cfg.steps)
        traced = should_trace_memory(step, self.cfg.steps)
        if traced:
            self.probe.begin()
            self.probe.point("step start", "forward")
        t0, m0 = now(), self.clock.mark()
        self.log.begin_step(m0)  # one origin for the collectives and the phase spans
        marks: list[tuple[str, Any, Any]] = []
        losses = [self._micro(step, m, traced, marks) for m in range(self.cfg.grad_accum_steps)]
        if self.ledger is not None and self.ledger.active:  # FSDP2 sets the reduced shards as .grad
            self.ledger.retag([p.grad for p in self.model.parameters()], "grads")
        self.probe.point("backward end", "backward")
        m4 = self.clock.mark()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        maybe_diverge(self.cfg, self.rank, step, self.model, self.tel)
        m5 = self.clock.mark()
        self.clock.settle()  # the step's one wait for the GPU (none on CPU)
        at = lambda m: t0 + self.clock.seconds(m0, m)  # noqa: E731  (a mark as host perf_counter seconds)
        t4, t5 = at(m4), at(m5)
        spans = [(phase, at(a), at(b)) for phase, a, b in marks]
        loss = sum(float(v) for v in losses)
        self.probe.point("optimizer end", "optimizer")
        records = self.log.resolved()
        fwd = sum(b - a for p, a, b in spans if p == "forward")
        bwd = sum(b - a for p, a, b in spans if p == "backward")
        self.last_phases = spans + [("optimizer", t4, t5)]
        # CPU: the union of the blocking collectives' spans. CUDA: not measured (None), see above.
        exp_f, exp_b = (exposed_comm_s(records, "forward"), exposed_comm_s(records, "backward")) \
            if self.host_clock else (0.0, 0.0)
        extra: dict[str, Any] = dict(backward_start_ts=wall_ts(spans[-1][1]), comm_exposed_measured=self.host_clock)
        if sampled:
            extra.update(phase_spans=[dict(phase=p, start_s=a - t0, end_s=b - t0) for p, a, b in spans])
            self._emit_comm(step, records)
        if traced:
            self._emit_curve(step)
        return step_fields(start=t0, loss=loss, samples=self.cfg.global_batch_size, step_time_s=t5 - t0,
                           forward_s=fwd - exp_f, backward_s=bwd - exp_b,
                           comm_exposed_s=exp_f + exp_b if self.host_clock else None,
                           optimizer_s=t5 - t4, **extra)

    def _emit_comm(self, step: int, records: list[dict[str, Any]]) -> None:
        if not self.log.recording:  # this torch's FSDP2 could not be recorded: no figure, not a zero
            return
        source = "host" if self.host_clock else "cuda"
        for r in records:
            self.tel.emit("fsdp_collective", step=step, clock=source, **r)
        self.tel.emit("comm_volume", step=step,
                      **volume_fields(records, self.backend, self.world, self.theory, self.formula))

    def _emit_curve(self, step: int) -> None:
        """The traced step's curve by kind, sampled at FSDP's hooks (its peak is the ledger's, in
        the sampler's `memory` event)."""
        points = self.probe.end()
        if points:
            self.tel.emit("fsdp_memory_curve", step=step, points=points, source=CURVE_SOURCE)
