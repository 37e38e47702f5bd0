"""Each `nn.DataParallel` the script builds, watched from the moment it is built.

On CPU, DataParallel keeps no device ids and runs the module unwrapped
(torch/nn/parallel/data_parallel.py): there is nothing of DP to record, and the run says so once.

On CUDA (device ids set), `DataParallel.forward` calls its own `scatter`, `replicate`,
`parallel_apply` and `gather` methods; `patch_data_parallel` wraps those four (the class
attributes: the script's calls and their results are unchanged) and `DpWatch` marks each phase on
each device's current stream, as the GPU DP path does (`engine.modes.dp.cuda`, whose marking
helpers are reused): broadcast (replicate), scatter, forward (parallel_apply: each device's
stream bounds its replica's kernels), gather, then the loss on device 0 and, by autograd hooks,
each replica's backward and the gradient reduce (`engine.modes.dp.hooks.mark_backward`,
`mark_reduce`, `mark_loss_end`). Bytes are those of the tensors each copy was handed
(`engine.modes.dp.book.StarTraffic`).

Per step (`comm_split`): the marks are CUDA events, read once `Event.query()` says they completed
(at a later step's end; never a synchronize), then the step's `dp_phase` events and per-device
`comm_volume` are emitted; the step's own event says `comm_exposed_measured: false`. With host
marks (the CPU fakes of the tests) they are read at once and device 0's broadcast + scatter +
gather (forward) and reduce (backward) are the step's exposed comm, as in `mode=dp`. The
optimizer phase is not marked (the step's `optimizer_s` times it on the host).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.nn as nn

from ddpviz.engine.attach.session import DeferredMarks, Session
from ddpviz.engine.attach.steps import compiled_away
from ddpviz.engine.attach.transparent import past_wrappers, wrapper

PART = "data parallel"  # the guard's name for this instrumentation
CPU_NOTE = "nn.DataParallel on CPU runs the module unwrapped: no DP phases to record"
HOST_SOURCE = "host clock around each phase (a test's CPU stand-ins for torch.nn.parallel's copies)"


class DpWatch(DeferredMarks):
    """The instrumentation of one `nn.DataParallel` with device ids; a watch of the step tracker
    (`engine.attach.steps`). `clock`: makes one step's clock (default
    `engine.modes.dp.hooks.CudaStreamClock` over the DP's device ids)."""

    reduces_gradients = False  # DP has no no_sync: every backward reduces
    DEFERRED_PART = PART

    def __init__(self, session: Session, tracker: Any, dp: nn.DataParallel,
                 clock: Callable[[], Any] | None = None):
        from ddpviz.engine.modes.dp.book import tensor_nbytes, theory_star_bytes
        from ddpviz.engine.modes.dp.hooks import CudaStreamClock

        self.s, self.tracker, self.dp = session, tracker, dp
        self.module, self.device = dp.module, dp.src_device_obj
        self.n = len(dp.device_ids)
        self.names = [f"{self.device.type}:{i}" for i in dp.device_ids]
        self.make_clock = clock or (lambda: CudaStreamClock(dp.device_ids))
        self.param_nbytes = [tensor_nbytes([p]) for p in dp.module.parameters()]
        self.theory = theory_star_bytes(self.n, sum(self.param_nbytes))
        self.step_of: int | None = None  # the step the current book belongs to
        self.book = self.traffic = self.clock = None
        self.micro = -1
        self.deferred: list[tuple[int, Any, Any, Any]] = []  # (step, book, traffic, clock) not yet readable
        session.set_device(self.device.type, self.device.index)
        dp.register_forward_pre_hook(self._pre, with_kwargs=True)
        dp.register_forward_hook(self._post, always_call=True)
        dp._ddpviz_watch = self

    # -- the DP module's forward (hooks) ----------------------------------------------------------
    @compiled_away
    def _pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        from ddpviz.engine.attach.steps import batch_samples

        self.s.guard("steps", self.tracker.forward_start, self, False, batch_samples(args, kwargs))
        self.s.guard(PART, self._begin_forward)

    @compiled_away
    def _post(self, module: nn.Module, args: tuple, output: Any) -> None:
        self.s.guard("steps", self.tracker.forward_end)

    def _begin_forward(self) -> None:
        from ddpviz.engine.modes.dp.book import SpanBook, StarTraffic

        if self.step_of != self.tracker.step:  # the step's first forward: a new book and clock origin
            self.step_of, self.micro = self.tracker.step, 0
            self.book, self.traffic, self.clock = SpanBook(), StarTraffic(self.n), self.make_clock()
            self.clock.begin(range(self.n))
        else:
            self.micro += 1

    def active(self) -> bool:
        return self.book is not None and PART not in self.s.disabled

    # -- the four phases of DataParallel.forward (called by the wrapped methods) -------------------
    def start(self, phase: str) -> None:
        for d in range(self.n):
            self.book.start(phase, d, self.micro, self.clock.mark(d))

    def end(self, phase: str) -> None:
        for d in range(self.n):
            self.book.end(phase, d, self.micro, self.clock.mark(d))

    def scattered(self, out: Any) -> None:
        from ddpviz.engine.modes.dp.book import tensor_nbytes
        from ddpviz.engine.modes.dp.comm import tensor_leaves

        inputs, kwargs = out
        self.traffic.from_hub("scatter", self.micro, [tensor_nbytes(tensor_leaves(list(i)) + tensor_leaves(k))
                                                      for i, k in zip(inputs, kwargs)] + [0] * (self.n - len(inputs)))

    def replicated(self, replicas: list[nn.Module]) -> None:
        from ddpviz.engine.modes.dp.book import tensor_nbytes
        from ddpviz.engine.modes.dp.cuda import replica_tensors

        self.replicas = replicas
        self.traffic.from_hub("broadcast", self.micro, [tensor_nbytes(replica_tensors(r)) for r in replicas]
                              + [0] * (self.n - len(replicas)))

    def applied(self, outputs: list[Any]) -> None:
        """After the replicas' forward: hooks that mark each replica's backward and the reduce."""
        if not torch.is_grad_enabled():
            return
        from ddpviz.engine.modes.dp.comm import tensor_leaves
        from ddpviz.engine.modes.dp.cuda import broadcast_node
        from ddpviz.engine.modes.dp.hooks import mark_backward, mark_reduce

        node = broadcast_node(self.replicas[0])
        outs = [next(t for t in tensor_leaves(o) if t.grad_fn is not None) for o in outputs]
        mark_backward(outs, node, self.book, self.clock, self.micro)
        mark_reduce(node, len(outputs), self.book, self.clock, self.micro, self.traffic, self.param_nbytes)

    def gathered(self, outputs: list[Any], out: Any) -> None:
        from ddpviz.engine.modes.dp.book import tensor_nbytes
        from ddpviz.engine.modes.dp.comm import tensor_leaves
        from ddpviz.engine.modes.dp.hooks import mark_loss_end

        self.traffic.to_hub("gather", self.micro, [tensor_nbytes(tensor_leaves(o)) for o in outputs]
                            + [0] * (self.n - len(outputs)))
        if torch.is_grad_enabled():
            first = next((t for t in tensor_leaves(out) if t.grad_fn is not None), None)
            if first is not None:  # the loss runs from here to the gather's backward (device 0)
                self.book.start("loss", 0, self.micro, self.clock.mark(0))
                mark_loss_end(first, self.book, self.clock, self.micro, self.traffic)

    # -- the step tracker ---------------------------------------------------------------------------
    def begin_backward(self, synced: bool) -> None:
        pass  # the backward and reduce are marked by autograd hooks (`applied`)

    def comm_split(self, step: int, micros: list[dict]) -> tuple[float, float, dict[str, Any]]:
        """(exposed comm in forward, in backward, extra step fields) of `step` (module docstring)."""
        if self.step_of != step or not self.active():
            return 0.0, 0.0, {}
        return self.s.guard(PART, self._split, step) or (0.0, 0.0, {})

    def _split(self, step: int) -> tuple[float, float, dict[str, Any]]:
        from ddpviz.engine.modes.dp.book import COMM_PHASES, phase_seconds

        self.deferred.append((step, self.book, self.traffic, self.clock))
        self.book = None
        spans_now = self._emit_completed().get(step)
        if spans_now is None or _is_cuda_clock(self.clock):
            return 0.0, 0.0, dict(comm_exposed_measured=False)
        fwd = phase_seconds(spans_now, tuple(p for p in COMM_PHASES if p != "reduce"))
        return fwd, phase_seconds(spans_now, ("reduce",)), dict(comm_exposed_measured=True)

    def _item_marks(self, item: tuple[int, Any, Any, Any]) -> list[Any]:
        return [m for pair in item[1]._marks.values() for m in pair]

    def _emit_completed(self) -> dict[int, list[Any]]:
        """Emit the leading deferred steps whose marks completed; returns their spans by step."""
        done: dict[int, list[Any]] = {}
        while self.deferred and _completed(self.deferred[0][1]):
            st, book, traffic, clock = self.deferred.pop(0)
            done[st] = book.resolve(clock.seconds)
            self._emit(st, done[st], traffic, clock)
        return done

    def _emit(self, step: int, spans: list[Any], traffic: Any, clock: Any) -> None:
        from ddpviz.engine.modes.dp.cuda import COMM_SOURCE, PHASE_SOURCE

        source = PHASE_SOURCE if _is_cuda_clock(clock) else HOST_SOURCE
        self.s.emit_many("dp_phase", [dict(phase=sp.phase, device=self.names[sp.device], start_s=sp.start_s,
                                           end_s=sp.end_s, micro=sp.micro,
                                           nbytes=traffic.span_nbytes.get((sp.phase, sp.device, sp.micro), 0))
                                      for sp in spans], step=step, source=source)
        for i, name in enumerate(self.names):
            self.s.emit("comm_volume", step=step, device=name, sent_bytes=traffic.sent[i], recv_bytes=traffic.recv[i],
                        theory_sent_bytes=self.theory[i], theory_recv_bytes=self.theory[i], volume_source=COMM_SOURCE)

    def started_fields(self) -> dict[str, Any]:
        """`run_started`'s mode and the DP's devices."""
        kind = self.device.type
        return dict(mode="dp", device_names=self.names, devices=[dict(
            name=n, kind=kind, total_memory_bytes=(torch.cuda.get_device_properties(i).total_memory
                                                   if kind == "cuda" else None))
            for n, i in zip(self.names, self.dp.device_ids)])


def _is_cuda_clock(clock: Any) -> bool:
    from ddpviz.engine.modes.dp.hooks import CudaStreamClock

    return isinstance(clock, CudaStreamClock)


def _completed(book: Any) -> bool:
    """Every mark of `book` is readable: host marks at once, CUDA events once they completed."""
    return all(m is None or not hasattr(m, "query") or m.query() for pair in book._marks.values() for m in pair)


def watch_data_parallel(session: Session, tracker: Any, dp: nn.DataParallel,
                        clock: Callable[[], Any] | None = None) -> DpWatch | None:
    """The `DpWatch` of `dp` (new, or the one it has); None when the part is off."""
    watch = getattr(dp, "_ddpviz_watch", None)
    if watch is not None:
        return watch
    watch = session.guard(PART, DpWatch, session, tracker, dp, clock)
    if watch is not None:
        tracker.watches.append(watch)
    return watch


def patch_data_parallel(session: Session, tracker: Any) -> None:
    """Wrap `nn.DataParallel.__init__` and its four phase methods (see the module docstring)."""
    cls = nn.DataParallel
    init = cls.__init__

    @wrapper
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        with past_wrappers(init):  # DataParallel's warnings name the script's line (engine.attach.transparent)
            init(self, *args, **kwargs)
        if not self.device_ids:
            session.guard(PART, session.emit, "log", level="info", message=CPU_NOTE)
        else:
            watch_data_parallel(session, tracker, self)

    cls.__init__ = __init__
    for name, phase, after in (("scatter", "scatter", "scattered"), ("replicate", "broadcast", "replicated"),
                               ("parallel_apply", "forward", "applied"), ("gather", "gather", "gathered")):
        setattr(cls, name, _timed_method(session, getattr(cls, name), phase, after))


def _timed_method(session: Session, method: Callable, phase: str, after: str) -> Callable:
    """`method` between marks of `phase` on every device, then the watch's `after` with its
    result (gather: with its outputs too); the call itself is DataParallel's own."""

    @functools.wraps(method)
    def timed(self, *args, **kwargs):
        watch = getattr(self, "_ddpviz_watch", None)
        if watch is None or not watch.active():
            return method(self, *args, **kwargs)
        marked = session.guard(PART, lambda: watch.start(phase) or True)
        out = method(self, *args, **kwargs)
        if marked and watch.active():
            session.guard(PART, watch.end, phase)
            extra = (args[0],) if phase == "gather" else ()
            session.guard(PART, getattr(watch, after), *extra, out)
        return out

    return timed
