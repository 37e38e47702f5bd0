"""`mode=dp`: DataParallel — one process, one thread per device, device 0 at the centre.

Each step follows `torch.nn.DataParallel.forward` (torch/nn/parallel/data_parallel.py):
broadcast (`replicate`: new replica modules from device 0's parameters and buffers), scatter
(split the batch with `chunk`), forward (parallel_apply: one thread per device), gather (outputs
to device 0), loss (on device 0), backward (the loss gradient scattered back, each replica's
backward in its thread), reduce (gradients summed onto device 0, as `Broadcast.backward`'s
reduce_add does), optimizer (device 0 only). Replicas are thrown away after the step.

On CPU the devices are virtual (`cpu:0..N-1`): real threads and real tensor copies (at RAM speed,
where GPUs copy over PCIe or NVLink), so every phase has a real duration and a real byte count;
the UI labels it "emulated". On GPUs `engine.modes.dp.cuda` uses torch.nn.parallel's own functions.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import Callable

import torch
import torch.nn as nn

from ddpviz.engine.components.devices import DevicePlan
from ddpviz.engine.components.faults import DIVERGE_NUDGE, diverge_note, maybe_fail
from ddpviz.engine.components.loop import drive
from ddpviz.engine.components.training import (
    autocast,
    cpu_device_threads,
    evaluate,
    make_optimizer,
    micro_loss,
    should_eval,
)
from ddpviz.engine.config import RunConfig
from ddpviz.engine.data import BatchPlan, Dataset
from ddpviz.engine.events import REPLICA_CHECK_PHASE
from ddpviz.engine.measure.gil import GilMeter, Measured, MeterGate, Span
from ddpviz.engine.measure.ledger import LedgerMode, TensorLedger
from ddpviz.engine.measure.memory import optimizer_state_tensors, param_bytes, tensor_bytes
from ddpviz.engine.measure.memory_sampler import DeviceProbe, MemorySampler
from ddpviz.engine.measure.sync import tensors_checksum
from ddpviz.engine.measure.telemetry import Telemetry, now, step_fields
from ddpviz.engine.modes.dp.comm import Copy, Gathered, gather_outputs, grads_for_replicas, reduce_add_coalesced
from ddpviz.engine.modes.dp.replicate import Replicas, replicate_cpu
from ddpviz.engine.modes.dp.state import BufferWatch


class PhaseLog:
    """Collects `dp_phase` spans of one step: (phase, device, start_s, end_s, nbytes)."""

    def __init__(self, t0: float):
        self.t0 = t0
        self.spans: list[tuple[str, int, float, float, int]] = []
        self.copies: dict[tuple[str, int], int] = {}  # (phase, device) -> buffers that crossed

    def add_copies(self, phase: str, copies: list[Copy], hub_start: float) -> None:
        """One span per device for its copies in `phase` (first start to last end, their bytes
        and count), and device 0's span from `hub_start` to now with every byte and copy."""
        for j in sorted({c.device for c in copies}):
            mine = [c for c in copies if c.device == j]
            self.add(phase, j, min(c.start for c in mine), max(c.end for c in mine), sum(c.nbytes for c in mine))
            self.copies[(phase, j)] = self.copies.get((phase, j), 0) + len(mine)
        self.add(phase, 0, hub_start, now(), sum(c.nbytes for c in copies))
        self.copies[(phase, 0)] = self.copies.get((phase, 0), 0) + len(copies)

    def add(self, phase: str, device: int, start: float, end: float, nbytes: int = 0) -> None:
        self.spans.append((phase, device, start - self.t0, end - self.t0, nbytes))

    def rebound(self, phase: str, device: int, first: int, start: float, end: float) -> None:
        """Set the start and end (perf_counter s) of the `(phase, device)` span logged at index
        `first` or later."""
        for k in range(first, len(self.spans)):
            p, d, _, _, nb = self.spans[k]
            if (p, d) == (phase, device):
                self.spans[k] = (p, d, start - self.t0, end - self.t0, nb)

    def total(self, phases: tuple[str, ...], device: int = 0) -> float:
        return sum(e - s for p, d, s, e, _ in self.spans if d == device and p in phases)


class EmulatedDP:
    """DP over `n` virtual CPU devices; `master` is device 0's module, the one copy that persists.

    `sent`/`recv` count, per device and step, the bytes of every tensor copied between device 0
    and that device (broadcast, scatter, gather, the output gradients, reduce), measured on the
    copies themselves. `ledger` (when tracing) attributes each copy to the device receiving it.
    `gil` measures, per phase span, the lock wait of the thread that ran it (`engine.measure.gil`):
    each device's forward and backward in its pool thread, device 0's other phases in the caller's.
    """

    COMM_PHASES = ("broadcast", "scatter", "gather", "reduce")

    def __init__(self, cfg: RunConfig, model: nn.Module, n: int, ledger: TensorLedger | None = None):
        self.cfg, self.master, self.n, self.ledger = cfg, model, n, ledger
        self.pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="dp-device")
        self.sent = [0] * n
        self.recv = [0] * n
        self.checksums: list[list[float]] | None = None  # the replicas as they computed, on check steps
        self.last_log: PhaseLog | None = None
        self.check_span: tuple[float, float] | None = None  # the checksums' own time, this step
        self.buffers = BufferWatch()  # buffer updates the replicas made and DP discards
        self.gil = GilMeter(MeterGate())  # thread clocks read on sampled steps (engine.measure.gil)

    def _hub(self, phase: str, fn: Callable[[], object], log: PhaseLog):
        """Run device 0's serial phase `fn` on this (the driving) thread, its lock wait measured.

        Device 0's span of the phase is set to the meter's own boundaries, so the wait measured
        over it always falls inside it (the thread can wait for the GIL between the meter's
        reading and the phase's first clock read)."""
        first = len(log.spans)
        with Measured(self.gil) as m:
            out = fn()
        self.gil.add(phase, 0, m.span)
        log.rebound(phase, 0, first, m.span.begin.wall_s, m.span.end.wall_s)
        return out

    def _on(self, device: int, kind: str):
        """Attribute what this thread creates to `device` as `kind`, while memory is traced."""
        led = self.ledger
        return led.working_for(device, kind) if led is not None and led.active else nullcontext()

    def _move(self, src: int, dst: int, nbytes: int) -> None:
        self.sent[src] += nbytes
        self.recv[dst] += nbytes

    def _broadcast(self, log: PhaseLog) -> Replicas:
        """`replicate`: new replica modules; devices 1..n-1 receive the flat buffers of
    `broadcast_coalesced` (bytes and copies measured)."""
        t_all = now()
        led = self.ledger if self.ledger is not None and self.ledger.active else None
        reps = replicate_cpu(self.master, self.n, led)
        log.add_copies("broadcast", reps.copies, t_all)
        for c in reps.copies:
            self._move(0, c.device, c.nbytes)
        return reps

    def _scatter(self, x: torch.Tensor, log: PhaseLog) -> list[torch.Tensor]:
        """`chunk` the batch; device 0 keeps a view, the others get copies."""
        t_all = now()
        chunks, copies = list(x.chunk(self.n)), []
        for i in range(1, self.n):
            t = now()
            with self._on(i, "inputs"):
                chunks[i] = chunks[i].clone()
            copies.append(Copy(i, t, now(), tensor_bytes([chunks[i]])))
            self._move(0, i, copies[-1].nbytes)
        log.add_copies("scatter", copies, t_all)
        return chunks

    def _in_threads(self, phase: str, fn: Callable[[int], torch.Tensor | None], log: PhaseLog):
        """Run fn(i) on every device's thread (parallel_apply) and log each span."""
        led = self.ledger if self.ledger is not None and self.ledger.active else None

        def timed(i):
            a = self.gil.read()
            with LedgerMode(led, device=i) if led is not None else nullcontext():
                r = fn(i)
            b = self.gil.read()
            self.gil.add(phase, i, Span(a, b))
            return r, a.wall_s, b.wall_s
        results = list(self.pool.map(timed, range(self.n)))
        for i, (_, t, e) in enumerate(results):
            log.add(phase, i, t, e)
        return [r for r, _, _ in results]

    def _forward(self, reps: Replicas, chunks, log, step: int):
        def fwd(i):
            maybe_fail(self.cfg, i, step)  # a failing device thread fails the whole DP process
            with autocast(self.cfg, "cpu"):
                return reps.modules[i](chunks[i])  # the whole output: gather moves every tensor
        return self._in_threads("forward", fwd, log)

    def _gather(self, outs, log) -> Gathered:
        """Every tensor of the outputs concatenated on device 0 (`scatter_gather.gather`,
        `engine.modes.dp.comm.gather_outputs`), detached so each replica keeps its own graph;
        device 0's own part is a local copy."""
        t_all = now()
        led = self.ledger if self.ledger is not None and self.ledger.active else None
        g = gather_outputs(outs, ledger=led)
        log.add_copies("gather", g.copies, t_all)
        for c in g.copies:
            self._move(c.device, 0, c.nbytes)
        return g

    def _backward(self, reps: Replicas, g: Gathered, log) -> None:
        """Scatter d(loss)/d(outputs) back (each output tensor the loss reached) and run each
        replica's backward in its thread."""
        per = grads_for_replicas(g, self.n)
        for i in range(1, self.n):
            with self._on(i, "grad_outputs"):
                per[i] = (per[i][0], [t.clone() for t in per[i][1]])
            self._move(0, i, tensor_bytes(per[i][1]))

        def bwd(i):
            torch.autograd.backward(per[i][0], per[i][1])
            if self.ledger is not None and self.ledger.active:
                self.ledger.retag((p.grad for p in reps.params[i]), "grads")
        self._in_threads("backward", bwd, log)

    def _reduce(self, reps: Replicas, log) -> None:
        """`ReduceAddCoalesced`: every replica's gradient of every parameter (zeros where it got
        none: frozen or unused), in 10 MiB flat buffers, summed onto device 0. A parameter that
        requires grad gets the sum (zeros if no replica used it, as in torch); a frozen one's is
        dropped, as `Broadcast.backward` returns it for an input that needs none."""
        master = reps.params[0]
        t_all = now()
        led = self.ledger if self.ledger is not None and self.ledger.active else None
        sums, copies = reduce_add_coalesced([[r.grad for r in reps.params[j]] for j in range(1, self.n)],
                                            master, ledger=led)
        for m, total in zip(master, sums):
            if not m.requires_grad or total is None:
                continue
            if m.grad is None:
                m.grad = total
                if led is not None:
                    led.retag([total], "grads")
            else:
                m.grad.add_(total)
        for j in range(1, self.n):
            for r in reps.params[j]:
                r.grad = None
        log.add_copies("reduce", copies, t_all)
        for c in copies:
            self._move(c.device, 0, c.nbytes)

    def _diverge(self, reps: Replicas, step: int, micro: int) -> None:
        """`fault=diverge`: nudge replica `fault_rank`'s weights for this step only (rank 0's are
        device 0's own: the one master copy is nudged for good)."""
        cfg = self.cfg
        if cfg.fault == "diverge" and step == cfg.fault_step and micro == 0:
            with torch.no_grad():
                for p in reps.params[cfg.fault_rank]:
                    p.add_(DIVERGE_NUDGE)

    def _check(self, reps: Replicas) -> None:
        """On check steps, after forward and backward: each replica's parameters as it computed
        with them (this step's broadcast copies; a write after the copy, `fault=diverge` or an
        in-place write in forward, would show) against device 0's, and the buffers the replicas
        changed that DP will discard (`engine.modes.dp.state`). Timed as the instrument's own."""
        t = now()
        with self.ledger.paused() if self.ledger is not None else nullcontext():
            self.checksums = [tensors_checksum(ps) for ps in reps.params]
            self.buffers.observe(self.master, reps.modules)
        self.check_span = (t, now())

    def _alone(self, x, y, log: PhaseLog, accum: int, step: int, micro: int) -> float:
        """`micro_step` on one device, as torch's DataParallel runs it: the module itself, on the calling thread,
        its gradients on its own parameters; no replicas, no gather, no reduce (torch/nn/parallel/data_parallel.py:
        ``if len(self.device_ids) == 1: return self.module(*inputs[0], **module_kwargs[0])``). Emulating the
        broadcast, gather and reduce there had DP x1 spend 0.43 ms a step in copies torch never makes (22% over
        single; a new user's sweep, 2026-12-06)."""
        cfg, master = self.cfg, self.master
        if cfg.fault == "diverge" and step == cfg.fault_step and micro == 0:  # the one copy, nudged for good
            with torch.no_grad():
                for p in master.parameters():
                    p.add_(DIVERGE_NUDGE)
        with Measured(self.gil) as m:
            maybe_fail(cfg, 0, step)
            with autocast(cfg, "cpu"):
                out = master(x)
        self.gil.add("forward", 0, m.span)
        log.add("forward", 0, m.span.begin.wall_s, m.span.end.wall_s)
        with Measured(self.gil) as m:
            loss = micro_loss(out, y, accum)
            loss.backward()
        self.gil.add("backward", 0, m.span)
        log.add("backward", 0, m.span.begin.wall_s, m.span.end.wall_s)
        if micro == 0 and should_eval(cfg, step):  # one device: its checksum is the model's
            t = now()
            with self.ledger.paused() if self.ledger is not None else nullcontext():
                self.checksums = [tensors_checksum(master.parameters())]
            self.check_span = (t, now())
        return loss.item()

    def micro_step(self, x, y, log: PhaseLog, accum: int, step: int, micro: int) -> float:
        """One micro-batch through all phases but the optimizer; returns its loss (one device: `_alone`)."""
        if self.n == 1:
            return self._alone(x, y, log, accum, step, micro)
        reps = self._hub("broadcast", lambda: self._broadcast(log), log)
        self._diverge(reps, step, micro)
        chunks = self._hub("scatter", lambda: self._scatter(x, log), log)
        outs = self._forward(reps, chunks, log, step)
        gathered = self._hub("gather", lambda: self._gather(outs, log), log)
        with Measured(self.gil) as m, self._on(0, "loss"):
            loss = micro_loss(gathered.output, y, accum)
            loss.backward()  # only d(loss)/d(gathered), on device 0
        self.gil.add("loss", 0, m.span)
        log.add("loss", 0, m.span.begin.wall_s, m.span.end.wall_s)
        self._backward(reps, gathered, log)
        if micro == 0 and should_eval(self.cfg, step):
            self._check(reps)
        self._hub("reduce", lambda: self._reduce(reps, log), log)
        return loss.item()


def train_dp(cfg: RunConfig, plan: DevicePlan, ds: Dataset, model: nn.Module, tel: Telemetry,
             should_stop: Callable[[], bool] | None = None) -> nn.Module:
    """Train with DP on `plan`'s devices; returns the master module (device 0)."""
    if plan.kind == "cuda":
        from ddpviz.engine.modes.dp.cuda import train_dp_cuda

        return train_dp_cuda(cfg, plan, ds, model, tel, should_stop)
    n = cfg.world_size
    ledger = TensorLedger(n)
    dp = EmulatedDP(cfg, model.train(), n, ledger)
    opt = make_optimizer(cfg, model.parameters())
    batches = BatchPlan(len(ds), n, cfg.micro_batch_per_device, cfg.seed)
    P = param_bytes(model)

    def train_step(step: int) -> dict:
        t0 = now()
        log = PhaseLog(t0)
        dp.sent, dp.recv, dp.check_span = [0] * n, [0] * n, None
        dp.gil.begin_step(step)
        loss = 0.0
        for micro in range(cfg.grad_accum_steps):
            idx = batches.global_indices(step * cfg.grad_accum_steps + micro)
            with dp._on(0, "inputs"):
                x, y = ds.x_train[idx], ds.y_train[idx]
            loss += dp.micro_step(x, y, log, cfg.grad_accum_steps, step, micro)
        with Measured(dp.gil) as m, dp._on(0, "optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        dp.gil.add("optimizer", 0, m.span)
        log.add("optimizer", 0, m.span.begin.wall_s, m.span.end.wall_s)
        t_end = now()
        dp.last_log = log
        waits = dp.gil.span_waits([(phase, dev) for phase, dev, *_ in log.spans])
        tel.emit_many("dp_phase", [dict(phase=phase, device=plan.names[dev], start_s=s, end_s=e, nbytes=nb,
                                        copies=log.copies.get((phase, dev), 0), gil_wait_s=w)
                                   for (phase, dev, s, e, nb), w in zip(log.spans, waits)], step=step)
        for i, fields in enumerate(dp.gil.device_fields(n, t_end - t0) if dp.gil.on else []):
            tel.emit("gil", step=step, device=plan.names[i], **fields)
        for i in range(n):
            theory = (P * (n - 1) if i == 0 else P) * cfg.grad_accum_steps
            tel.emit("comm_volume", step=step, device=plan.names[i], sent_bytes=dp.sent[i],
                     recv_bytes=dp.recv[i], volume_source="measured", theory_sent_bytes=theory,
                     theory_recv_bytes=theory)
        if cfg.fault == "diverge" and step == cfg.fault_step:
            tel.emit("log", step=step, level="warning", message=diverge_note(cfg))
        extra = {"replica_check": True} if should_eval(cfg, step) else {}  # its time includes the checksums
        return step_fields(start=t0, loss=loss, samples=cfg.global_batch_size, step_time_s=t_end - t0,
                           forward_s=log.total(("forward",)), backward_s=log.total(("loss", "backward")),
                           comm_exposed_s=log.total(EmulatedDP.COMM_PHASES),
                           optimizer_s=log.total(("optimizer",)), **extra)

    def existing():  # between steps only device 0 holds anything: the master copy
        return [(0, "params", model.parameters()), (0, "buffers", model.buffers()),
                (0, "grads", [p.grad for p in model.parameters()]),
                (0, "optimizer_state", optimizer_state_tensors(opt))]

    def check_sync(step: int) -> None:
        sums, dp.checksums = dp.checksums, None
        dp.buffers.emit_sync(tel, step, sums)

    probes = [DeviceProbe(name, ledger_index=i, process_shared=True) for i, name in enumerate(plan.names)]
    def phases_of(i: int):  # the step's own spans on device i, in perf_counter seconds
        log = dp.last_log
        spans = [(p, log.t0 + s, log.t0 + e) for p, d, s, e, _ in log.spans if d == i]
        return spans + ([(REPLICA_CHECK_PHASE, *dp.check_span)] if dp.check_span else [])

    sampler = MemorySampler(tel, probes, cfg.steps, ledger=ledger, existing=existing, phases_of=phases_of)
    try:
        with cpu_device_threads(cfg.world_size):
            drive(cfg, tel, sampler.wrap(train_step), should_stop=should_stop, check_sync=check_sync,
                  evaluate=lambda: evaluate(model, ds, torch.device("cpu")))
    finally:
        sampler.close()
        dp.pool.shutdown(wait=True)
    return model
