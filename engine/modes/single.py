"""`mode=single`: one device trains on the whole global batch — the baseline for speed and numerics.

The global micro-batch is every rank's shard in rank order (`BatchPlan.global_indices`), so after k
steps the parameters must equal DP's and DDP's (up to float summation order).
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.nn as nn

from ddpviz.engine.components.faults import maybe_fail
from ddpviz.engine.components.loop import drive
from ddpviz.engine.components.training import (autocast, batch_to, cpu_device_threads, evaluate, make_optimizer,
                                               micro_loss)
from ddpviz.engine.config import RunConfig
from ddpviz.engine.data import BatchPlan, Dataset
from ddpviz.engine.measure.clocks import StepClock
from ddpviz.engine.measure.deferred import deferred_steps
from ddpviz.engine.measure.memory_sampler import model_memory_sampler, should_trace_memory
from ddpviz.engine.measure.telemetry import Telemetry, now, step_fields, wall_ts


def train_single(cfg: RunConfig, ds: Dataset, model: nn.Module, device: torch.device, tel: Telemetry,
                 should_stop: Callable[[], bool] | None = None) -> nn.Module:
    """Train `model` on `device` for `cfg.steps` steps; returns the trained model."""
    model.to(device).train()
    opt = make_optimizer(cfg, model.parameters())
    plan = BatchPlan(len(ds), cfg.world_size, cfg.micro_batch_per_device, cfg.seed)

    clock = StepClock(device)  # CUDA events (engine.measure.clocks)
    # On CUDA an ordinary step is read once its events completed (`DeferredSteps`), as a DDP rank's: no
    # synchronize but on the memory-traced and last steps, so the baseline pays the instrument's cost as DDP does
    later = deferred_steps(device)

    def train_step(step: int) -> dict | None:
        t0, m0 = now(), clock.mark()
        micro_marks, losses = [], []
        for micro in range(cfg.grad_accum_steps):
            idx = plan.global_indices(step * cfg.grad_accum_steps + micro)
            x, y = batch_to(ds.x_train[idx], device), batch_to(ds.y_train[idx], device)
            maybe_fail(cfg, 0, step)
            m1 = clock.mark()
            with autocast(cfg, device.type):
                loss = micro_loss(model(x), y, cfg.grad_accum_steps)
            m2 = clock.mark()
            loss.backward()
            micro_marks.append((m1, m2, clock.mark()))
            losses.append(loss.detach())
        m4 = clock.mark()
        opt.step()
        opt.zero_grad(set_to_none=False)
        m5 = clock.mark()

        def fields_at(t5: float, loss: float) -> dict:
            return step_fields(start=t0, backward_start_ts=wall_ts(t0 + clock.seconds(m0, micro_marks[-1][1])),
                               loss=loss, samples=cfg.global_batch_size, step_time_s=t5 - t0,
                               forward_s=sum(clock.seconds(a, b) for a, b, _ in micro_marks),
                               backward_s=sum(clock.seconds(b, c) for _, b, c in micro_marks),
                               comm_exposed_s=0.0, optimizer_s=clock.seconds(m4, m5))

        if later is not None and not should_trace_memory(step, cfg.steps):  # the last step is traced
            later.add_step(step, clock, m0, m5, losses, lambda s, loss: fields_at(t0 + s, loss))
            return None
        clock.settle()
        # with steps read late, the devices may still have been running earlier steps at t0: the step's own
        # time is its marks' (the host's wall time from t0 would count the end of those steps again)
        return fields_at(now() if later is None else t0 + clock.seconds(m0, m5), sum(float(v) for v in losses))

    sampler = model_memory_sampler(cfg, tel, model, opt, device)
    threads = cpu_device_threads(cfg.world_size) if device.type == "cpu" else contextlib.nullcontext()
    try:
        with threads:  # on CPU the baseline is one virtual device of the run's size
            drive(cfg, tel, sampler.wrap(train_step), should_stop=should_stop,
                  evaluate=lambda: evaluate(model, ds, device), later=later)
    finally:
        sampler.close()
    return model
