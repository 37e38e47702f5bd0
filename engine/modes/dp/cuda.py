"""DP on real GPUs with torch.nn.parallel's own functions, each phase timed on the device that runs it.

Each micro-step follows `torch.nn.DataParallel.forward` (torch/nn/parallel/data_parallel.py):
`replicate` (broadcast), `scatter`, the replicas' forward in one thread per device (as
`parallel_apply`, see `engine.modes.dp.hooks.apply_in_threads`), `gather` to device 0, the loss on
device 0, then one backward through it all, in which autograd scatters d loss / d outputs back,
runs each replica's backward on its device's thread, and reduces the replicas' gradients onto
device 0 inside `Broadcast.backward` (`comm.reduce_add_coalesced`). The optimizer steps on
device 0 after the last micro-step.

Measured, per device and per micro-step (`engine.modes.dp.book.SpanBook`), with CUDA events on
that device's current stream: broadcast, scatter and gather around the copies (marks on every
device, so each sees its own end of the copy), forward inside each device's thread, backward
and reduce by autograd hooks where autograd runs them (`engine.modes.dp.hooks`), loss and optimizer on
device 0. Phases: broadcast, scatter, forward, gather, loss, backward, reduce, optimizer, as on
CPU (`engine.modes.dp.emulated`); exposed communication = device 0's broadcast + scatter + gather + reduce.
Bytes: those of the tensors each copy was handed (`engine.modes.dp.book.StarTraffic`), never a
formula; the formula is reported beside them as theory. A step is read once every device reached its end
(`CudaDP.issue`, `engine.measure.deferred`): no synchronize but on check steps and the last.
Lock wait: every mark also reads the calling thread's clocks (`engine.measure.gil.MeteredBook`), so
each device's forward thread and autograd thread, and the driving thread's phases on device 0,
report the time they waited for the GIL (host threads: the CUDA events do not see it).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, NamedTuple, Sequence

import torch
import torch.nn as nn
from torch.nn.parallel import gather, replicate, scatter

from ddpviz.engine.components.devices import DevicePlan
from ddpviz.engine.components.loop import drive
from ddpviz.engine.components.training import (autocast, batch_to, evaluate, logits_of, make_optimizer, micro_loss,
                                               should_eval)
from ddpviz.engine.config import RunConfig
from ddpviz.engine.data import BatchPlan, Dataset
from ddpviz.engine.measure.deferred import DEFERRED_STEP_TIME, LossReading, deferred_steps
from ddpviz.engine.measure.gil import GilMeter, MeteredBook
from ddpviz.engine.measure.memory import (
    allocator_rounded_bytes,
    cuda_event,
    optimizer_state_bytes,
    optimizer_state_tensors,
    param_bytes,
)
from ddpviz.engine.measure.memory_timer import DeviceProbe, MemoryTimer
from ddpviz.engine.measure.sync import tensors_checksum
from ddpviz.engine.measure.telemetry import Telemetry, now, should_sample_memory, step_fields
from ddpviz.engine.modes.dp.book import (
    COMM_PHASES,
    Span,
    SpanBook,
    StarTraffic,
    phase_seconds,
    tensor_nbytes,
    theory_star_bytes,
    unique_tensors,
)
from ddpviz.engine.modes.dp.comm import tensor_leaves
from ddpviz.engine.modes.dp.hooks import CudaStreamClock, apply_in_threads, mark_backward, mark_loss_end, mark_reduce
from ddpviz.engine.modes.dp.state import BufferWatch

COMM_SOURCE = "measured: bytes of the tensors torch.nn.parallel copied"
PHASE_SOURCE = "cuda events on each device's stream"


def replica_params(replica: nn.Module) -> list[torch.Tensor]:
    """The parameter copies `replicate` put into a replica (exposed as `_former_parameters`;
    a replica's `parameters()` is empty), each tied tensor once."""
    return unique_tensors(t for m in replica.modules() for t in m._former_parameters.values())


def replica_tensors(replica: nn.Module) -> list[torch.Tensor]:
    """Parameter and buffer copies of a replica: what `replicate` broadcast to its device."""
    return unique_tensors([*replica_params(replica), *(b for m in replica.modules() for b in m._buffers.values())])


def broadcast_node(replica: nn.Module) -> Any:
    """The autograd node of `Broadcast` whose backward is the gradient reduce.

    Raises:
        ValueError: no parameter copy requires grad (nothing would be reduced).
    """
    for t in replica_params(replica):
        if t.grad_fn is not None:
            return t.grad_fn
    raise ValueError("no parameter of the model requires grad: DP has nothing to reduce")


def _timed(book: SpanBook, clock: Any, phase: str, micro: int, devices: Sequence[int],
           fn: Callable[[], Any]) -> Any:
    """Run `fn` between marks on every device's stream (a copy runs on the source's stream and
    the destination waits for it: aten/src/ATen/native/cuda/Copy.cu)."""
    for d in devices:
        book.start(phase, d, micro, clock.mark(d))
    out = fn()
    for d in devices:
        book.end(phase, d, micro, clock.mark(d))
    return out


class CudaDP:
    """DP over cuda:0..n-1 with torch.nn.parallel; `model` (on cuda:0) is the master copy."""

    def __init__(self, cfg: RunConfig, model: nn.Module, n: int, *, device_type: str = "cuda",
                 clock: Any = None):
        self.cfg, self.model, self.ids = cfg, model, list(range(n))
        self.device_type = device_type  # "cpu" only in tests, with torch.nn.parallel's copies faked
        self.clock = clock if clock is not None else CudaStreamClock()
        self.param_nbytes = [tensor_nbytes([p]) for p in model.parameters()]
        self.check = False  # True on check steps: checksums and buffers of the step's own replicas
        self.checksums_seen: list[list[float]] | None = None
        self.buffers = BufferWatch()
        self.held_at_start: dict[int, tuple[int, int]] = {}  # set on memory-sampled steps (`_held_now`)

    def micro_step(self, x: torch.Tensor, y: torch.Tensor, micro: int, book: SpanBook,
                   traffic: StarTraffic) -> torch.Tensor:
        """One micro-batch (x, y on cuda:0) through every phase but the optimizer; returns the
        loss (not synchronised)."""
        ids, clock, n = self.ids, self.clock, len(self.ids)
        replicas = _timed(book, clock, "broadcast", micro, ids, lambda: replicate(self.model, ids))
        traffic.from_hub("broadcast", micro, [tensor_nbytes(replica_tensors(r)) for r in replicas])
        inputs = _timed(book, clock, "scatter", micro, ids, lambda: scatter(x, ids))
        traffic.from_hub("scatter", micro, [tensor_nbytes([t]) for t in inputs])
        outs = apply_in_threads(replicas, inputs, device_type=self.device_type,
                                amp=lambda: autocast(self.cfg, self.device_type), book=book, clock=clock,
                                micro=micro, devices=ids if self.device_type == "cuda" else None)
        node = broadcast_node(replicas[0])
        mark_backward([logits_of(o) for o in outs], node, book, clock, micro)
        mark_reduce(node, n, book, clock, micro, traffic, self.param_nbytes)
        out = _timed(book, clock, "gather", micro, ids, lambda: gather(outs, 0))
        traffic.to_hub("gather", micro, [tensor_nbytes(tensor_leaves(o)) for o in outs])  # every tensor
        book.start("loss", 0, micro, clock.mark(0))
        loss = micro_loss(out, y, self.cfg.grad_accum_steps)
        mark_loss_end(out, book, clock, micro, traffic)
        loss.backward()
        if self.check and micro == 0:
            self._check(replicas)
        return loss.detach()

    def _check(self, replicas: list[nn.Module]) -> None:
        """The replicas this step built, after their forward and backward: checksums of each one's
        parameter copies (replica 0's are device 0's own) and the buffers they changed
        (`engine.modes.dp.state`). Synchronises: check steps are marked `replica_check`."""
        with torch.no_grad():
            self.checksums_seen = [tensors_checksum(replica_params(r)) for r in replicas]
        self.buffers.observe(self.model, replicas)

    def _held_now(self, opt: torch.optim.Optimizer) -> dict[int, tuple[int, int]]:
        """Per device: (allocator bytes held now, bytes of the training's own tensors on it now:
        parameters, buffers, gradients, optimizer state, allocator-rounded). Between steps only
        device 0 holds training tensors (replicas are rebuilt every step), so whatever the others
        hold is a library's (their cuBLAS workspaces, made by the replicas' matmuls)."""
        own = list(self.model.parameters()) + list(self.model.buffers()) + \
            [p.grad for p in self.model.parameters()] + optimizer_state_tensors(opt)
        training = {d: 0 for d in self.ids}
        training[0] = allocator_rounded_bytes([t for t in own if t is not None and t.device.type == "cuda"])
        return {d: (int(torch.cuda.memory_allocated(d)), training[d]) for d in self.ids}

    def step(self, micro_batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
             opt: torch.optim.Optimizer, *, reset_peaks: bool = False) -> "StepRecord":
        """Every micro-batch, then the optimizer on device 0; one synchronize at the end (`issue`, then
        the record read at once)."""
        issued = self.issue(micro_batches, opt, reset_peaks=reset_peaks)
        self.clock.synchronize(self.ids)
        return issued.record()

    def issue(self, micro_batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
              opt: torch.optim.Optimizer, *, reset_peaks: bool = False) -> "IssuedStep":
        """Every micro-batch, then the optimizer on device 0, queued: the step's record is read from
        the returned `IssuedStep` once its marks completed (`ready()`), with no synchronize, or at once
        after `clock.synchronize`.

        Args:
            reset_peaks: reset every device's allocator peak (`torch.cuda.reset_peak_memory_stats`)
                before the step, so `max_memory_allocated` read after it is this step's peak
                (memory-sampled steps), not the process's.
        """
        book, traffic = MeteredBook(SpanBook()), StarTraffic(len(self.ids))
        if reset_peaks:
            for d in self.ids:
                torch.cuda.reset_peak_memory_stats(d)
            self.held_at_start = self._held_now(opt)
        t0 = now()
        self.clock.begin(self.ids)
        losses = [self.micro_step(x, y, micro, book, traffic) for micro, (x, y) in enumerate(micro_batches)]
        book.start("optimizer", 0, 0, self.clock.mark(0))
        opt.step()
        opt.zero_grad(set_to_none=True)
        end = self.clock.mark(0)
        book.end("optimizer", 0, 0, end)
        # every device's stream's last work of the step (replica d's backward and the reduce run on it)
        ends = [end] + [self.clock.mark(d) for d in self.ids[1:]]
        gil = GilMeter()
        book.meter_spans(gil)  # host readings, taken with each mark
        return IssuedStep(t0, self.clock, self.clock.frozen(), ends, LossReading(losses), book, traffic, gil)


class IssuedStep(NamedTuple):
    """A DP step issued to the devices (`CudaDP.issue`): its marks (`ends`: the last on each device's
    stream, device 0's the optimizer's end), its loss on its way to the host and what the host
    recorded (spans to resolve, bytes, lock waits)."""

    t0: float
    clock: Any
    seconds: Callable[[int, Any], float]  # this step's origins (`clock.frozen()`)
    ends: list[Any]
    loss: LossReading
    book: Any
    traffic: StarTraffic
    gil: GilMeter

    def ready(self) -> bool:
        """Whether every device reached the step's end and the loss reached the host (`Event.query()`)."""
        return all(self.clock.done(m) for m in self.ends) and self.loss.ready()

    def record(self) -> "StepRecord":
        """The step's record, once `ready()` (or after a synchronize). Its time is device 0's, from its
        origin to its end mark, on every step: the host's wall time from `t0` would also hold the end of
        the steps before it that the devices were still running when it was issued (steps read late)."""
        return StepRecord(self.t0, self.seconds(0, self.ends[0]), self.loss.read(), self.book.resolve(self.seconds),
                          self.traffic, self.gil)


class StepRecord(NamedTuple):
    """One optimizer step: host start (`now()`), wall seconds, summed loss, spans, bytes."""

    t0: float
    step_time_s: float
    loss: float
    spans: list[Span]
    traffic: StarTraffic
    gil: GilMeter | None = None

    def measures(self, samples: int) -> dict[str, Any]:
        """The `step` event's fields; each phase summed over the step's micro-steps, on device 0."""
        return step_fields(start=self.t0, loss=self.loss, samples=samples, step_time_s=self.step_time_s,
                           forward_s=phase_seconds(self.spans, ("forward",)),
                           backward_s=phase_seconds(self.spans, ("loss", "backward")),
                           comm_exposed_s=phase_seconds(self.spans, COMM_PHASES),
                           optimizer_s=phase_seconds(self.spans, ("optimizer",)))

    def emit(self, tel: Telemetry, step: int, names: Sequence[str], theory: Sequence[int]) -> None:
        """`dp_phase` per span, `comm_volume` per device (measured bytes beside `theory`) and
        `gil` per device (the lock wait of its host threads, `engine.measure.gil`)."""
        gil = self.gil if self.gil is not None else GilMeter()
        waits = gil.span_waits([(s.phase, s.device) for s in self.spans])
        tel.emit_many("dp_phase", [dict(phase=s.phase, device=names[s.device], start_s=s.start_s, end_s=s.end_s,
                                        nbytes=self.traffic.span_nbytes.get((s.phase, s.device, s.micro), 0),
                                        gil_wait_s=w) for s, w in zip(self.spans, waits)],
                      step=step, source=PHASE_SOURCE)
        for i, fields in enumerate(gil.device_fields(len(names), self.step_time_s)):
            tel.emit("gil", step=step, device=names[i], **fields)
        for i, name in enumerate(names):
            tel.emit("comm_volume", step=step, device=name, sent_bytes=self.traffic.sent[i],
                     recv_bytes=self.traffic.recv[i], theory_sent_bytes=theory[i],
                     theory_recv_bytes=theory[i], volume_source=COMM_SOURCE)


def train_dp_cuda(cfg: RunConfig, plan: DevicePlan, ds: Dataset, model: nn.Module, tel: Telemetry,
                  should_stop: Callable[[], bool] | None = None) -> nn.Module:
    """Train with torch.nn.parallel DP on cuda:0..N-1; returns the module on cuda:0."""
    n, dev0 = cfg.world_size, torch.device("cuda:0")
    model.to(dev0).train()
    dp = CudaDP(cfg, model, n)
    opt = make_optimizer(cfg, model.parameters())
    batches = BatchPlan(len(ds), n, cfg.micro_batch_per_device, cfg.seed)
    theory = [b * cfg.grad_accum_steps for b in theory_star_bytes(n, param_bytes(model))]

    def micro_batches(step: int):
        for micro in range(cfg.grad_accum_steps):
            idx = batches.global_indices(step * cfg.grad_accum_steps + micro)
            yield batch_to(ds.x_train[idx], dev0), batch_to(ds.y_train[idx], dev0)

    # An ordinary step is read once every device's marks completed (`DeferredSteps`), with no synchronize, as a
    # DDP rank's; check steps (their replica checksums synchronise) and the last one synchronise once. Every step
    # goes through the queue, so its `dp_phase`, `gil` and `comm_volume` events come in step order.
    later = deferred_steps(dev0)

    def train_step(step: int) -> None:
        dp.check = should_eval(cfg, step)
        check = {"replica_check": True} if dp.check else {}
        issued = dp.issue(micro_batches(step), opt, reset_peaks=should_sample_memory(step, cfg.steps))

        def read(rec: StepRecord, **extra) -> dict:
            rec.emit(tel, step, plan.names, theory)
            return rec.measures(cfg.global_batch_size) | check | extra

        if dp.check or step == cfg.steps - 1:
            dp.clock.synchronize(dp.ids)
            rec = issued.record()
            later.add(step, lambda: True, lambda: read(rec))
        else:
            later.add(step, issued.ready, lambda: read(issued.record(), step_time_source=DEFERRED_STEP_TIME))

    def memory(step: int) -> None:
        for i in dp.ids:
            extra = dict(optimizer_state=optimizer_state_bytes(opt)) if i == 0 else {}
            tel.emit("memory", step=step, device=plan.names[i],
                     **cuda_event(torch.device(f"cuda:{i}"), extra, start=dp.held_at_start.get(i)))

    def check_sync(step: int) -> None:
        sums, dp.checksums_seen = dp.checksums_seen, None
        dp.buffers.emit_sync(tel, step, sums)

    timer = MemoryTimer(tel, [DeviceProbe(name, ledger_index=None, cuda_index=i, process_shared=True)
                              for i, name in enumerate(plan.names)])  # memory_readings, 20/s per GPU
    try:
        drive(cfg, tel, train_step, should_stop=should_stop, memory=memory, check_sync=check_sync,
              evaluate=lambda: evaluate(model, ds, dev0), later=later)
    finally:
        timer.close()
    return model
