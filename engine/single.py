"""`mode=single`: one device trains on the whole global batch — the baseline for speed and numerics.

The global micro-batch is every rank's shard in rank order (`BatchPlan.global_indices`), so after k
steps the parameters must equal DP's and DDP's (up to float summation order).
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.nn as nn

from engine.config import RunConfig
from engine.data import BatchPlan, Dataset
from engine.faults import maybe_fail
from engine.loop import drive
from engine.ledger import TensorLedger
from engine.memory import optimizer_state_tensors
from engine.memsampler import DeviceProbe, MemorySampler, phase_hooks
from engine.telemetry import Telemetry, now, step_fields, wall_ts
from engine.training import autocast, cpu_device_threads, evaluate, loss_fn, make_optimizer


def train_single(cfg: RunConfig, ds: Dataset, model: nn.Module, device: torch.device, tel: Telemetry,
                 should_stop: Callable[[], bool] | None = None) -> nn.Module:
    """Train `model` on `device` for `cfg.steps` steps; returns the trained model."""
    model.to(device).train()
    opt = make_optimizer(cfg, model.parameters())
    plan = BatchPlan(len(ds), cfg.world_size, cfg.micro_batch_per_device, cfg.seed)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def train_step(step: int) -> dict:
        t0 = now()
        fwd = bwd = 0.0
        loss_sum = 0.0
        for micro in range(cfg.grad_accum_steps):
            idx = plan.global_indices(step * cfg.grad_accum_steps + micro)
            x, y = ds.x_train[idx].to(device), ds.y_train[idx].to(device)
            maybe_fail(cfg, 0, step)
            t1 = now()
            with autocast(cfg, device.type):
                loss = loss_fn(model(x), y) / cfg.grad_accum_steps
            sync()
            t2 = now()
            backward_start = t2
            loss.backward()
            sync()
            t3 = now()
            fwd, bwd, loss_sum = fwd + t2 - t1, bwd + t3 - t2, loss_sum + loss.item()
        t4 = now()
        opt.step()
        opt.zero_grad(set_to_none=False)
        sync()
        t5 = now()
        return step_fields(start=t0, backward_start_ts=wall_ts(backward_start), loss=loss_sum, samples=cfg.global_batch_size, step_time_s=t5 - t0,
                           forward_s=fwd, backward_s=bwd, comm_exposed_s=0.0, optimizer_s=t5 - t4)

    sampler = single_sampler(cfg, tel, model, opt, device)
    threads = cpu_device_threads(cfg.world_size) if device.type == "cpu" else contextlib.nullcontext()
    try:
        with threads:  # on CPU the baseline is one virtual device of the run's size
            drive(cfg, tel, sampler.wrap(train_step), should_stop=should_stop,
                  evaluate=lambda: evaluate(model, ds, device))
    finally:
        sampler.close()
    return model


def single_sampler(cfg: RunConfig, tel: Telemetry, model: nn.Module, opt: torch.optim.Optimizer,
                   device: torch.device, extra_existing=None) -> MemorySampler:
    """The memory sampler of one model on one device (single, and each DDP rank): the ledger
    counts this process's tensors on `device`; the timer adds process RSS (and, on CUDA, the
    allocator and NVML). `extra_existing()` adds more ``(0, kind, tensors)`` alive at a step's start."""
    ledger = TensorLedger(1, device_type=device.type)

    def existing():
        out = [(0, "params", model.parameters()), (0, "buffers", model.buffers()),
               (0, "grads", [p.grad for p in model.parameters()]),
               (0, "optimizer_state", optimizer_state_tensors(opt))]
        return out + list(extra_existing() if extra_existing else [])

    probe = DeviceProbe(tel.device, ledger_index=0,
                        cuda_index=(device.index or 0) if device.type == "cuda" else None)
    return MemorySampler(tel, [probe], cfg.steps, ledger=ledger, existing=existing,
                         hooks=lambda: phase_hooks(ledger, model, opt))
