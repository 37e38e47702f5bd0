"""Where DP's work happens, marked on the device that does it: forward threads and autograd hooks.

torch.nn.parallel runs each replica's forward in its own thread (`parallel_apply`), each replica's
backward in the autograd engine's thread for that device, and the gradient reduce inside
`Broadcast.backward` (torch/nn/parallel/_functions.py -> `comm.reduce_add_coalesced`). A timer on
device 0's stream alone sees none of that apart. Here every mark is taken by the thread or hook
that queues that device's work, on that device's current stream (`CudaStreamClock`), so each
device gets its own spans:

- forward: `apply_in_threads`, a re-implementation of `parallel_apply` that marks each replica's
  forward inside its thread and re-enters autocast there with an explicit dtype (autocast's dtype
  is thread-local and `parallel_apply` passes only `enabled`, so its threads would run CUDA's
  default fp16 while the caller asked for bf16);
- backward: a pre-hook on each replica output's grad_fn (its gradient has arrived) and post-hooks
  on the nodes of that replica's graph that hand gradients to the broadcast node (the last one
  to fire ends the device's backward);
- reduce: a pre-hook and a post-hook on the broadcast's backward node, which is the reduce;
- loss: ends when the gather's backward node is about to run (d loss / d outputs is ready); that
  node's post-hook counts the output gradients scattered back to the replicas.

Autograd runs hooks in the thread that runs the node and under that node's stream
(torch/csrc/autograd/engine.cpp, `evaluate_function`: `OptionalStreamGuard` on `func.stream()`).
The functions here take any clock and work on CPU graphs too, which is how they are tested.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, ContextManager, Sequence

import torch
from torch._utils import ExceptionWrapper

from ddpviz.engine.measure.telemetry import now
from ddpviz.engine.modes.dp.book import SpanBook, StarTraffic, tensor_nbytes


class HostClock:
    """Host clock marks (perf_counter seconds), one origin for every device. For CPU graphs."""

    def begin(self, devices: Sequence[int]) -> None:
        self.origin = now()

    def mark(self, device: int) -> float:
        return now()

    def seconds(self, device: int, mark: float) -> float:
        return mark - self.origin

    def done(self, mark: float) -> bool:
        return True

    def frozen(self) -> Callable[[int, float], float]:
        """`seconds` from this step's origin, kept when the next step's `begin` sets another."""
        origin = self.origin
        return lambda device, mark: mark - origin

    def synchronize(self, devices: Sequence[int]) -> None:
        pass


class CudaStreamClock:
    """CUDA events recorded on `device`'s current stream (in the calling thread).

    `begin` records an origin event on every device; spans on device d are measured from d's own
    origin (`cudaEventElapsedTime` needs both events on one device). The origins must fire together
    for the devices' lanes to share one time axis, and the streams need not be idle at the step's
    start (a step read late, `engine.measure.deferred`, leaves device 0 still running the previous
    step's optimizer when the next one is issued): device 0's origin is recorded first and every other
    device's stream waits for it (`Stream.wait_event`, across devices) before recording its own. That
    wait holds nothing back: each replica's first work is the broadcast from device 0, which waits for
    device 0 anyway.

    Args:
        cuda_index: the CUDA device of each device slot (default: slot i is cuda:i).
    """

    def __init__(self, cuda_index: Sequence[int] | None = None):
        self.cuda_index = list(cuda_index) if cuda_index is not None else None

    def _cuda(self, device: int) -> int:
        return self.cuda_index[device] if self.cuda_index else device

    def begin(self, devices: Sequence[int]) -> None:
        first = self.mark(devices[0])
        self.origins = {devices[0]: first}
        for d in devices[1:]:
            torch.cuda.current_stream(self._cuda(d)).wait_event(first)
            self.origins[d] = self.mark(d)

    def mark(self, device: int) -> torch.cuda.Event:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream(self._cuda(device)))
        return ev

    def seconds(self, device: int, mark: torch.cuda.Event) -> float:
        return self.origins[device].elapsed_time(mark) / 1e3

    def done(self, mark: torch.cuda.Event) -> bool:
        """Whether the GPU has reached `mark` (`Event.query()`, never waits)."""
        return bool(mark.query())

    def frozen(self) -> Callable[[int, torch.cuda.Event], float]:
        """`seconds` from this step's origins, kept when the next step's `begin` records others."""
        origins = dict(self.origins)
        return lambda device, mark: origins[device].elapsed_time(mark) / 1e3

    def synchronize(self, devices: Sequence[int]) -> None:
        for d in devices:  # torch.cuda.synchronize() alone waits for the current device only
            torch.cuda.synchronize(self._cuda(d))


def _device_context(device_type: str, device: int | None, stream: Any) -> ContextManager:
    if device_type != "cuda":
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(torch.cuda.device(device))
    stack.enter_context(torch.cuda.stream(stream))
    return stack


def apply_in_threads(modules: Sequence[torch.nn.Module], inputs: Sequence[torch.Tensor], *,
                     device_type: str, amp: Callable[[], ContextManager], book: SpanBook, clock: Any,
                     micro: int, devices: Sequence[int] | None = None) -> list[Any]:
    """`parallel_apply(modules, inputs, devices=devices)` with each forward marked per device.

    As torch/nn/parallel/parallel_apply.py: one thread per module (the caller's thread when there
    is one module), each under its device and that device's current stream, grad mode carried
    over, exceptions re-raised in the caller naming the replica. Unlike it, autocast is entered
    in each thread through `amp()` (e.g. ``torch.autocast("cuda", dtype=torch.bfloat16)``), so
    the dtype is the caller's, not the thread's default.

    Args:
        inputs: one tensor per module (DP's scattered chunks).
        device_type: "cuda" (enter device and stream) or "cpu" (nothing to enter; tests).
        amp: returns the autocast context for one thread (a null context without amp).
        devices: CUDA device index of each module (required for "cuda").

    Returns:
        Each module's output, in module order.
    """
    n = len(modules)
    if len(inputs) != n:
        raise ValueError(f"need one input per module ({n}), got {len(inputs)}")
    devices = list(devices) if devices is not None else [None] * n
    streams = [torch.cuda.current_stream(d) if device_type == "cuda" else None for d in devices]
    grad_enabled = torch.is_grad_enabled()
    results: list[Any] = [None] * n

    def worker(i: int) -> None:
        torch.set_grad_enabled(grad_enabled)
        try:
            with _device_context(device_type, devices[i], streams[i]), amp():
                book.start("forward", i, micro, clock.mark(i))
                out = modules[i](inputs[i])
                book.end("forward", i, micro, clock.mark(i))
            results[i] = out
        except Exception:
            results[i] = ExceptionWrapper(where=f"in replica {i} on device {devices[i]}")

    if n == 1:
        worker(0)
    else:
        threads = [threading.Thread(target=worker, args=(i,), name=f"dp-device-{i}") for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for r in results:
        if isinstance(r, ExceptionWrapper):
            r.reraise()
    return results


def consumers_of(root: Any, target: Any) -> list[Any]:
    """Autograd nodes reachable from `root` (without passing `target`) with an edge into `target`.

    For a replica's output `root` and the broadcast node `target`, these are the nodes that hand
    that replica's parameter gradients over: when the last of them has run, its backward is done.
    """
    found, seen, todo = [], {id(root)}, [root]
    while todo:
        node = todo.pop()
        feeds = False
        for nxt, _ in node.next_functions:
            if nxt is None:
                continue
            if nxt is target:
                feeds = True
            elif id(nxt) not in seen:
                seen.add(id(nxt))
                todo.append(nxt)
        if feeds:
            found.append(node)
    return found


def mark_backward(outs: Sequence[torch.Tensor], target: Any, book: SpanBook, clock: Any,
                  micro: int) -> None:
    """Mark each replica's backward: start when its output's gradient is about to be used, end
    after the last node that passes a gradient to `target` (the broadcast node) has run.

    Raises:
        ValueError: an output has no grad_fn, or its graph never reaches `target`.
    """
    for i, out in enumerate(outs):
        if out.grad_fn is None:
            raise ValueError(f"replica {i}'s output does not require grad: nothing to time in backward")
        feeders = consumers_of(out.grad_fn, target)
        if not feeders:
            raise ValueError(f"replica {i}'s graph does not reach the broadcast of the parameters")
        out.grad_fn.register_prehook(lambda grads, i=i: book.start("backward", i, micro, clock.mark(i)))
        for node in feeders:
            node.register_hook(lambda gi, go, i=i: book.end("backward", i, micro, clock.mark(i)))


def mark_reduce(node: Any, n: int, book: SpanBook, clock: Any, micro: int, traffic: StarTraffic,
                nbytes_if_none: Sequence[int]) -> None:
    """Mark and count the gradient reduce, which is the backward of the broadcast `node`.

    `Broadcast.backward(*grads)` receives the gradients of every replica's copies, device-major
    (k tensors per device), and calls `ReduceAddCoalesced`, which copies device j's gradients to
    device 0 and sums them. A copy no gradient reached arrives as None and is reduced as zeros of
    its size (autograd materialises it), hence `nbytes_if_none[k]`.
    """
    k = len(nbytes_if_none)

    def before(grads: Sequence[torch.Tensor | None]) -> None:
        for d in range(n):
            book.start("reduce", d, micro, clock.mark(d))
        per_device = [sum(nbytes_if_none[i] if g is None else tensor_nbytes([g])
                          for i, g in enumerate(grads[j * k:(j + 1) * k])) for j in range(n)]
        traffic.to_hub("reduce", micro, per_device)

    def after(grad_inputs, grad_outputs) -> None:
        for d in range(n):
            book.end("reduce", d, micro, clock.mark(d))

    node.register_prehook(before)
    node.register_hook(after)


def mark_loss_end(gathered: torch.Tensor, book: SpanBook, clock: Any, micro: int,
                  traffic: StarTraffic, hub: int = 0) -> None:
    """End device 0's loss phase when the gather's backward is about to scatter d loss / d outputs
    back to the replicas, and count the bytes of that scatter (totals only, no span, as on CPU)."""
    node = gathered.grad_fn

    def before(grads) -> None:
        book.end("loss", hub, micro, clock.mark(hub))

    def after(grad_inputs, grad_outputs) -> None:
        traffic.from_hub(None, micro, [tensor_nbytes([g]) for g in grad_inputs])

    node.register_prehook(before)
    node.register_hook(after)
