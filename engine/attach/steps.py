"""Steps of an attached run, from what the script does: forward (each watched DDP's forward),
backward (`Tensor.backward`), the optimizer step (PyTorch's global optimizer step hooks,
`torch.optim.optimizer.register_optimizer_step_pre_hook` / `..._post_hook`).

A step ends when an optimizer step returns after at least one backward since the previous
step; its index counts those optimizer steps from 0 (a second optimizer stepped in the same
iteration adds no step; an optimizer that wraps another, e.g. ZeroRedundancyOptimizer, counts
once). Its events (docs/events.md, "attached runs"):

- `step`: `step_time_s` from the previous step's end (step 0: its first forward's start) to this
  one's, so the script's data loading and its own code are inside it, as `other_s`;
  `forward_s` (Σ the wrapped module's forward calls), `backward_s` (Σ `backward()` calls, less
  the exposed comm), `comm_exposed_s` (the synced backward's time after its last bucket was
  ready: what the all-reduce added), `optimizer_s`; `loss` = Σ of the scalar tensors
  `backward()` was called on; `samples` = the batch dimension of the first tensor the wrapped
  module received, Σ over micro-steps, × world_size (`samples_source` says so);
  `micro_steps`, `no_sync_micro_steps` (backwards whose forward ran under `no_sync()` /
  `require_backward_grad_sync = False`: DDP all-reduced nothing in them); in a process without a
  DDP every `backward()` is a micro-step and forward time and samples are not seen (0);
- `bucket` (the synced backward's buckets) and `comm_volume`, as a launched DDP rank emits them.

Every hook runs under the session's guard (`engine.attach.session.Session.guard`).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from engine.attach.session import Session
from engine.measure.telemetry import now, step_fields, wall_ts

SAMPLES_SOURCE = "batch dimension of the first tensor the DDP module received, summed over micro-steps, x world_size"


def batch_samples(args: tuple, kwargs: dict) -> int:
    """The leading dimension of the first tensor in a forward call's arguments (0 if none):
    what the wrapped module saw of the batch."""
    stack = list(args) + list(kwargs.values())
    while stack:
        x = stack.pop(0)
        if isinstance(x, torch.Tensor):
            return int(x.shape[0]) if x.dim() else 1
        if isinstance(x, (list, tuple)):
            stack[:0] = list(x)
        elif isinstance(x, dict):
            stack[:0] = list(x.values())
    return 0


class StepTracker:
    """Builds the step events of one process. `watches` are the `engine.attach.ddp.Watch`es."""

    def __init__(self, session: Session, on_step: Callable[[int, dict], None] | None = None):
        self.s = session
        self.on_step = on_step  # called after each step's events (run_started, memory)
        self.watches: list[Any] = []
        self.memory: Any = None  # engine.attach.memory.MemoryWatch, set by install
        self.step = 0
        self.prev_end: float | None = None
        self.opt_depth = 0
        self._fresh()

    def _fresh(self) -> None:
        self.start: float | None = None
        self.forward_s = 0.0
        self.fwd_t0: float | None = None
        self.pending: tuple[Any, bool] | None = None  # (watch, synced) of the forward awaiting its backward
        self.micro: list[dict] = []
        self.losses: list[torch.Tensor] = []
        self.samples = 0
        self.opt_t0: float | None = None

    # -- forward (called by engine.attach.ddp) --------------------------------------------------
    def forward_start(self, watch: Any, synced: bool, samples: int) -> None:
        t = now()
        if self.start is None:
            self.start = self.prev_end if self.prev_end is not None else t
            if self.memory is not None:
                self.s.guard("memory", self.memory.step_start, self.step, watch)
        self.fwd_t0, self.pending = t, (watch, synced)
        self.samples += samples

    def forward_end(self) -> None:
        if self.fwd_t0 is not None:
            self.forward_s += now() - self.fwd_t0
            self.fwd_t0 = None

    # -- backward (Tensor.backward) -------------------------------------------------------------
    def backward_start(self, loss: torch.Tensor) -> dict | None:
        if self.pending is None:
            if self.watches:  # a DDP script: a backward after no DDP forward is no micro-step of it
                return None
            watch, synced = None, False  # no DDP in this process (one device, nn.DataParallel): the loss's backward
        else:
            watch, synced = self.pending
            self.pending = None
        if synced:
            watch.begin_backward()
        if loss.numel() == 1:
            self.losses.append(loss.detach())
        if self.start is None:
            self.start = now()
        m = dict(watch=watch, synced=synced, t0=now())
        self.micro.append(m)
        return m

    def backward_end(self, m: dict) -> None:
        m["t1"] = now()

    # -- optimizer ------------------------------------------------------------------------------
    def optimizer_start(self, opt: Any = None) -> None:
        if self.memory is not None and opt is not None:
            self.s.guard("memory", self.memory.optimizer_seen, opt)
        self.opt_depth += 1
        if self.opt_depth == 1 and self.opt_t0 is None and self.micro:
            self.opt_t0 = now()

    def optimizer_end(self, opt: Any = None) -> None:
        self.opt_depth = max(0, self.opt_depth - 1)
        if self.opt_depth or not self.micro or self.opt_t0 is None:
            return
        end = now()
        try:
            self._emit_step(end)
        finally:
            if self.memory is not None and self.memory._open is not None:  # the step failed to close it
                try:  # whatever is switched off: a traced step left open would slow every step after it
                    self.memory.abandon()
                except Exception:
                    pass
            self.prev_end = end
            self.step += 1
            self._fresh()

    def _emit_step(self, end: float) -> None:
        step, micro = self.step, [m for m in self.micro if "t1" in m]
        synced = [m for m in micro if m["synced"]]
        bwd = sum(m["t1"] - m["t0"] for m in micro)
        exposed, backward_start, extra = 0.0, None, {}
        if synced:
            last = synced[-1]
            buckets = last["watch"].buckets(step)
            last_bwd = last["t1"] - last["t0"]
            ready = max((b["ready_s"] for b in buckets if b.get("ready_s") is not None), default=last_bwd)
            exposed = max(0.0, last_bwd - ready)
            backward_start = last["t0"]
            extra["backward_start_ts"] = wall_ts(backward_start)
            extra["comm_exposed_measured"] = bool(buckets)  # CUDA: bucket times come later (ddp.Watch.buckets)
        bwd -= exposed
        opt_s = end - self.opt_t0
        step_time = end - self.start
        loss = float(sum(float(v) for v in self.losses)) if self.losses else None
        samples = self.samples * self.s.world_size
        fields = step_fields(start=self.start, loss=loss, samples=samples, step_time_s=step_time,
                             forward_s=self.forward_s, backward_s=bwd, comm_exposed_s=exposed,
                             optimizer_s=opt_s, **extra)
        fields.update(other_s=max(0.0, step_time - self.forward_s - bwd - exposed - opt_s),
                      micro_steps=len(micro),
                      no_sync_micro_steps=sum(1 for m in micro if m["watch"] is not None and not m["synced"]),
                      samples_source=SAMPLES_SOURCE)
        if self.memory is not None:
            self.s.guard("memory", self.memory.step_end, fields)
        self.s.emit("step", step=step, **fields)
        if self.on_step is not None:
            self.on_step(step, fields)
