"""DP on real GPUs with torch.nn.parallel's own functions, each phase timed with CUDA events.

Phases as in `torch.nn.DataParallel.forward`: `replicate` (broadcast), `scatter`, `parallel_apply`
(forward), `gather`, loss, backward — whose autograd pass includes the reduce onto device 0
(`Broadcast.backward` → `ReduceAddCoalesced`), so on GPU "backward" spans both and "reduce" is not
timed separately — then the optimizer on device 0. Spans are the same for every device in a phase
(the functions run all devices at once); bytes follow DP's star pattern.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
from torch.nn.parallel import gather, parallel_apply, replicate, scatter

from engine.config import RunConfig
from engine.data import BatchPlan, Dataset
from engine.devices import DevicePlan
from engine.loop import drive
from engine.memory import cuda_event, optimizer_state_bytes, param_bytes
from engine.telemetry import Telemetry, now, step_fields
from engine.training import autocast, evaluate, loss_fn, make_optimizer, param_checksum

PHASES = ("broadcast", "scatter", "forward", "gather", "loss", "backward", "optimizer")


def train_dp_cuda(cfg: RunConfig, plan: DevicePlan, ds: Dataset, model: nn.Module, tel: Telemetry,
                  should_stop: Callable[[], bool] | None = None) -> nn.Module:
    """Train with torch.nn.parallel DP on cuda:0..N-1; returns the module on cuda:0."""
    ids = list(range(cfg.world_size))
    dev0 = torch.device("cuda:0")
    model.to(dev0).train()
    opt = make_optimizer(cfg, model.parameters())
    batches = BatchPlan(len(ds), cfg.world_size, cfg.micro_batch_per_device, cfg.seed)
    n, P = cfg.world_size, param_bytes(model)

    def train_step(step: int) -> dict:
        marks = {p: [torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)] for p in PHASES}
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        loss_total = 0.0
        t0 = now()
        for micro in range(cfg.grad_accum_steps):
            idx = batches.global_indices(step * cfg.grad_accum_steps + micro)
            x, y = ds.x_train[idx].to(dev0), ds.y_train[idx].to(dev0)
            marks["broadcast"][0].record()
            replicas = replicate(model, ids)
            marks["broadcast"][1].record()
            marks["scatter"][0].record()
            inputs = scatter(x, ids)
            marks["scatter"][1].record()
            marks["forward"][0].record()
            with autocast(cfg, "cuda"):
                outs = parallel_apply(replicas, [(i,) for i in inputs])
            marks["forward"][1].record()
            marks["gather"][0].record()
            out = gather(outs, 0)
            marks["gather"][1].record()
            marks["loss"][0].record()
            loss = loss_fn(out, y) / cfg.grad_accum_steps
            marks["loss"][1].record()
            marks["backward"][0].record()
            loss.backward()
            marks["backward"][1].record()
            loss_total += loss.item()
        marks["optimizer"][0].record()
        opt.step()
        opt.zero_grad(set_to_none=True)
        marks["optimizer"][1].record()
        torch.cuda.synchronize()
        step_time = now() - t0
        span = {p: (start.elapsed_time(a) / 1e3, start.elapsed_time(b) / 1e3) for p, (a, b) in marks.items()}
        xb = x.numel() * x.element_size()
        for p, (s, e) in span.items():
            for i in ids if p not in ("loss", "optimizer") else [0]:
                nb = {"broadcast": P, "scatter": xb // n}.get(p, 0)
                nb = nb * (n - 1) if i == 0 and p in ("broadcast", "scatter") else nb
                tel.emit("dp_phase", step=step, phase=p, device=plan.names[i], start_s=s, end_s=e, nbytes=nb)
        for i in ids:
            theory = P * (n - 1) if i == 0 else P
            tel.emit("comm_volume", step=step, device=plan.names[i], sent_bytes=theory, recv_bytes=theory,
                     theory_sent_bytes=theory, theory_recv_bytes=theory)
        dur = {p: e - s for p, (s, e) in span.items()}
        return step_fields(start=t0, loss=loss_total, samples=cfg.global_batch_size, step_time_s=step_time,
                           forward_s=dur["forward"], backward_s=dur["loss"] + dur["backward"],
                           comm_exposed_s=dur["broadcast"] + dur["scatter"] + dur["gather"],
                           optimizer_s=dur["optimizer"])

    def memory(step: int) -> None:
        for i in ids:
            extra = dict(optimizer_state=optimizer_state_bytes(opt)) if i == 0 else {}
            tel.emit("memory", step=step, device=plan.names[i], **cuda_event(torch.device(f"cuda:{i}"), extra))

    def check_sync(step: int) -> None:
        sums = [param_checksum(r) for r in replicate(model, ids)]
        tel.emit("sync", step=step, checksums=sums, in_sync=all(s == sums[0] for s in sums))

    drive(cfg, tel, train_step, should_stop=should_stop, memory=memory, check_sync=check_sync,
          evaluate=lambda: evaluate(model, ds, dev0))
    return model
