"""`mode=dp`: DataParallel — one process, one thread per device, device 0 at the centre.

Each step follows `torch.nn.DataParallel.forward` (torch/nn/parallel/data_parallel.py):
broadcast (replicate the weights from device 0), scatter (split the batch with `chunk`), forward
(parallel_apply: one thread per device), gather (outputs to device 0), loss (on device 0), backward
(the loss gradient scattered back, each replica's backward in its thread), reduce (gradients
summed onto device 0, as `Broadcast.backward`'s reduce_add does), optimizer (device 0 only).

On CPU the devices are virtual (`cpu:0..N-1`): persistent replica modules, real threads and real
tensor copies, so every phase has a real duration and a real byte count; the UI labels it
"emulated". On GPUs `engine.dp_cuda` uses torch.nn.parallel's own functions.
"""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import torch
import torch.nn as nn

from engine.config import RunConfig
from engine.data import BatchPlan, Dataset
from engine.devices import DevicePlan
from engine.faults import maybe_diverge, maybe_fail
from engine.loop import drive
from engine.memory import ActivationCounter, accounted_event, buffer_bytes, optimizer_state_bytes, \
    param_bytes, tensor_bytes
from engine.telemetry import Telemetry, now, step_fields
from engine.training import autocast, evaluate, logits_of, loss_fn, make_optimizer, param_checksum, \
    cpu_device_threads


class PhaseLog:
    """Collects `dp_phase` spans of one step: (phase, device, start_s, end_s, nbytes)."""

    def __init__(self, t0: float):
        self.t0 = t0
        self.spans: list[tuple[str, int, float, float, int]] = []

    def add(self, phase: str, device: int, start: float, end: float, nbytes: int = 0) -> None:
        self.spans.append((phase, device, start - self.t0, end - self.t0, nbytes))

    def total(self, phases: tuple[str, ...], device: int = 0) -> float:
        return sum(e - s for p, d, s, e, _ in self.spans if d == device and p in phases)


class EmulatedDP:
    """DP over `n` virtual CPU devices. `replicas[0]` is the master module (device 0)."""

    COMM_PHASES = ("broadcast", "scatter", "gather", "reduce")

    def __init__(self, cfg: RunConfig, model: nn.Module, n: int):
        self.cfg, self.n = cfg, n
        self.replicas = [model] + [copy.deepcopy(model) for _ in range(n - 1)]
        self.pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="dp-device")
        self.counters = [ActivationCounter() for _ in range(n)]
        self.sent = [0] * n
        self.recv = [0] * n
        self.held: list[dict[str, int]] = [{} for _ in range(n)]  # transient bytes per device

    def _broadcast(self, log: PhaseLog) -> None:
        """Copy device 0's parameters and buffers into every replica (real copies)."""
        src = list(self.replicas[0].parameters()) + list(self.replicas[0].buffers())
        nbytes = tensor_bytes(src)
        t_all = now()
        for i in range(1, self.n):
            t = now()
            with torch.no_grad():
                for a, b in zip(src, list(self.replicas[i].parameters()) + list(self.replicas[i].buffers())):
                    b.copy_(a)
            log.add("broadcast", i, t, now(), nbytes)
            self.recv[i] += nbytes
        self.sent[0] += nbytes * (self.n - 1)
        log.add("broadcast", 0, t_all, now(), nbytes * (self.n - 1))

    def _scatter(self, x: torch.Tensor, log: PhaseLog) -> list[torch.Tensor]:
        """`chunk` the batch; device 0 keeps a view, the others get copies."""
        t_all = now()
        chunks = list(x.chunk(self.n))
        for i in range(1, self.n):
            t = now()
            chunks[i] = chunks[i].clone()
            nb = tensor_bytes([chunks[i]])
            log.add("scatter", i, t, now(), nb)
            self.recv[i] += nb
            self.sent[0] += nb
        log.add("scatter", 0, t_all, now(), tensor_bytes(chunks[1:]))
        return chunks

    def _in_threads(self, phase: str, fn: Callable[[int], torch.Tensor | None], log: PhaseLog):
        """Run fn(i) on every device's thread (parallel_apply) and log each span."""
        def timed(i):
            t = now()
            r = fn(i)
            return r, t, now()
        results = list(self.pool.map(timed, range(self.n)))
        for i, (_, t, e) in enumerate(results):
            log.add(phase, i, t, e)
        return [r for r, _, _ in results]

    def _forward(self, chunks, log, step: int):
        def fwd(i):
            maybe_fail(self.cfg, i, step)  # a failing device thread fails the whole DP process
            with self.counters[i], autocast(self.cfg, "cpu"):
                return logits_of(self.replicas[i](chunks[i]))  # gather moves the logits only
        return self._in_threads("forward", fwd, log)

    def _gather(self, outs, log) -> torch.Tensor:
        """Outputs to device 0, concatenated; detached so each replica keeps its own graph."""
        t_all = now()
        parts = [outs[0].detach()]
        for i in range(1, self.n):
            t = now()
            parts.append(outs[i].detach().clone())
            nb = tensor_bytes([parts[-1]])
            log.add("gather", i, t, now(), nb)
            self.sent[i] += nb
            self.recv[0] += nb
        gathered = torch.cat(parts).requires_grad_()
        log.add("gather", 0, t_all, now(), tensor_bytes(parts[1:]))
        return gathered

    def _backward(self, outs, grad: torch.Tensor, log) -> None:
        """Scatter d(loss)/d(outputs) back and run each replica's backward in its thread."""
        grads = list(grad.chunk(self.n))
        for i in range(1, self.n):
            grads[i] = grads[i].clone()
            self.sent[0] += tensor_bytes([grads[i]])
            self.recv[i] += tensor_bytes([grads[i]])
        self._in_threads("backward", lambda i: outs[i].backward(grads[i]), log)

    def _reduce(self, log) -> None:
        """Sum every replica's gradients onto device 0 (copy, then add), then drop them."""
        master = list(self.replicas[0].parameters())
        t_all = now()
        for i in range(1, self.n):
            t = now()
            nb = 0
            for m, r in zip(master, self.replicas[i].parameters()):
                if r.grad is None:
                    continue
                g = r.grad.clone()  # the copy that crosses the link to device 0
                nb += tensor_bytes([g])
                m.grad = g if m.grad is None else m.grad.add_(g)
                r.grad = None
            log.add("reduce", i, t, now(), nb)
            self.sent[i] += nb
            self.recv[0] += nb
        log.add("reduce", 0, t_all, now(), tensor_bytes(master) * (self.n - 1))

    def micro_step(self, x, y, log: PhaseLog, accum: int, step: int) -> float:
        """One micro-batch through all eight phases but the optimizer; returns its loss."""
        self._broadcast(log)
        chunks = self._scatter(x, log)
        outs = self._forward(chunks, log, step)
        gathered = self._gather(outs, log)
        t = now()
        loss = loss_fn(gathered, y) / accum
        loss.backward()  # only d(loss)/d(gathered), on device 0
        log.add("loss", 0, t, now())
        self._backward(outs, gathered.grad, log)
        self._reduce(log)
        for i in range(self.n):
            self.held[i] = dict(activations=self.counters[i].nbytes, inputs=tensor_bytes([chunks[i]]),
                                outputs=tensor_bytes([outs[i]]))
        self.held[0].update(inputs=tensor_bytes([x, y]), gathered_outputs=2 * tensor_bytes([gathered]))
        return loss.item()


def train_dp(cfg: RunConfig, plan: DevicePlan, ds: Dataset, model: nn.Module, tel: Telemetry,
             should_stop: Callable[[], bool] | None = None) -> nn.Module:
    """Train with DP on `plan`'s devices; returns the master module (device 0)."""
    if plan.kind == "cuda":
        from engine.dp_cuda import train_dp_cuda

        return train_dp_cuda(cfg, plan, ds, model, tel, should_stop)
    dp = EmulatedDP(cfg, model.train(), cfg.world_size)
    opt = make_optimizer(cfg, model.parameters())
    batches = BatchPlan(len(ds), cfg.world_size, cfg.micro_batch_per_device, cfg.seed)
    n, P = cfg.world_size, param_bytes(model)

    def train_step(step: int) -> dict:
        t0 = now()
        log = PhaseLog(t0)
        dp.sent, dp.recv = [0] * n, [0] * n
        loss = 0.0
        for micro in range(cfg.grad_accum_steps):
            idx = batches.global_indices(step * cfg.grad_accum_steps + micro)
            loss += dp.micro_step(ds.x_train[idx], ds.y_train[idx], log, cfg.grad_accum_steps, step)
        t = now()
        opt.step()
        opt.zero_grad(set_to_none=True)
        log.add("optimizer", 0, t, now())
        if cfg.fault_rank > 0:  # a replica drifts; the next step's broadcast overwrites it
            maybe_diverge(cfg, cfg.fault_rank, step, dp.replicas[cfg.fault_rank])
        t_end = now()
        for phase, dev, s, e, nb in log.spans:
            tel.emit("dp_phase", step=step, phase=phase, device=plan.names[dev], start_s=s, end_s=e, nbytes=nb)
        for i in range(n):
            theory = P * (n - 1) if i == 0 else P
            tel.emit("comm_volume", step=step, device=plan.names[i], sent_bytes=dp.sent[i],
                     recv_bytes=dp.recv[i], theory_sent_bytes=theory * cfg.grad_accum_steps,
                     theory_recv_bytes=theory * cfg.grad_accum_steps)
        return step_fields(start=t0, loss=loss, samples=cfg.global_batch_size, step_time_s=t_end - t0,
                           forward_s=log.total(("forward",)), backward_s=log.total(("loss", "backward")),
                           comm_exposed_s=log.total(EmulatedDP.COMM_PHASES),
                           optimizer_s=log.total(("optimizer",)))

    def memory(step: int) -> None:
        for i, rep in enumerate(dp.replicas):
            breakdown = dict(params=param_bytes(rep), buffers=buffer_bytes(rep), **dp.held[i])
            breakdown["grads"] = P  # every replica computes a full gradient; device 0 keeps the sum
            if i == 0:
                breakdown["optimizer_state"] = optimizer_state_bytes(opt)
                breakdown["reduce_buffer"] = P  # one incoming replica gradient at a time
            tel.emit("memory", step=step, device=plan.names[i], **accounted_event(breakdown))

    def check_sync(step: int) -> None:
        dp._broadcast(PhaseLog(now()))  # DP re-broadcasts every step, so replicas match device 0
        sums = [param_checksum(r) for r in dp.replicas]
        tel.emit("sync", step=step, checksums=sums, in_sync=all(s == sums[0] for s in sums))

    try:
        with cpu_device_threads(cfg.world_size):
            drive(cfg, tel, train_step, should_stop=should_stop, memory=memory, check_sync=check_sync,
                  evaluate=lambda: evaluate(model, ds, torch.device("cpu")))
    finally:
        dp.pool.shutdown(wait=True)
    return model
