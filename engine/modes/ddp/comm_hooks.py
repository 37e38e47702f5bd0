"""Gradient compression: any DDP comm hook — PyTorch's fp16, bf16 and PowerSGD hooks, or a user's
own — run inside ddpviz's bucket recording, its wire bytes counted on the tensors it hands over.

DDP takes one comm hook (`DistributedDataParallel.register_comm_hook`, once), and ddpviz's is the
recorder (`engine.modes.ddp.comm_hook.BucketRecorder`). To run another hook as well, compose it:

    rec = BucketRecorder(world_size, overlap=True, names=names)
    compose(rec, hook, state, name="fp16_compress_hook")    # or a user's (hook, state)
    ddp.register_comm_hook(rec, recording_hook)

For every bucket the recorder then takes `ready` as before, calls `hook(state, bucket)` (the hook
does the averaging — PyTorch's all divide by world_size themselves — so the caller must not
pre-divide the loss: `compose` sets `rec.predivided = False`), and records:

- `comm_start`: when the hook handed its first tensor to `torch.distributed.all_reduce`;
- `comm_end`: when the future the hook returned completed (its collectives and its decompression);
- `nbytes`: the bytes of every tensor the hook handed to `torch.distributed.all_reduce` for this
  bucket (fp16 halves them; PowerSGD's are its P and Q factors and the tensors it leaves
  uncompressed), `collectives` (how many), `wire_dtype`;
- `uncompressed_nbytes` (the bucket's own flat buffer, what DDP's default all-reduce sends) and
  `compression_ratio` = uncompressed_nbytes / nbytes;
- `nonfinite_after_reduce`: whether the tensor the hook's future returned (the averaged bucket)
  holds a NaN or inf (fp16's range ends at 65504);
- `comm_hook`: the hook's name.

How the tensors are seen: while a hook runs for a bucket, and in every callback it chains on the
futures of its collectives (PowerSGD launches its second and third all-reduce from such
callbacks), a thread-local says which bucket is current, and `torch.distributed.all_reduce` is
wrapped (once per process, `_install_tap`; it only passes the call through when no bucket is
current) to count what it is handed. PyTorch's hooks call `dist.all_reduce` through the module
(torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py, powerSGD_hook.py), so they are
seen; collectives called otherwise (a process group's own `allreduce`, all-gathers) are not, and
then `collectives` is 0. The futures a wrapped all-reduce returns are wrapped too, so that their
`then` callbacks run with the bucket current; the hook's final future is unwrapped before DDP
sees it.

Pre-flight (`check_comm_hook`): bf16 needs NCCL (PyTorch refuses `bf16_compress_hook` otherwise),
PowerSGD needs `start_powerSGD_iter` > 1 (`PowerSGDState`, with error feedback and warm start on,
as here), and on gloo DDP's gradients in one bucket: PyTorch's `powerSGD_hook` waits (`.wait()`) for its
next all-reduce inside the `then` callback of the one before, which gloo runs on its worker threads (2 per
process group), so with two buckets or more those threads wait for each other from the first compressed
step on and the run hangs. Seen with plain torch 2.13 and no ddpviz: 2 gloo ranks, 12 x Linear(64, 64),
buckets of 166,400 + 33,280 B stopped at step 10 (`start_powerSGD_iter` 10) every time; one bucket trained on.
"""

import threading
from typing import Any, Callable

import torch
import torch.distributed as dist

from ddpviz.engine.components.devices import PreflightError
from ddpviz.engine.config import RunConfig
from ddpviz.engine.modes.ddp.comm_hook import BucketRecorder, wire_nbytes

HOOK_NAMES = {"fp16": "fp16_compress_hook", "bf16": "bf16_compress_hook", "powersgd": "powerSGD_hook"}
# PyTorch's words when DDP refuses bf16_compress_hook (torch/nn/parallel/distributed.py,
# `_check_comm_hook`, torch 2.13): quoted when ddpviz refuses it before launch
TORCH_BF16_REFUSAL = "BF16 all reduce communication hook required CUDA 11+ and NCCL 2.10+ or XPU and XCCL"

_local = threading.local()  # .tap: the _BucketTap collectives on this thread are counted into


class _BucketTap:
    """What the hook handed to all-reduce for one bucket."""

    __slots__ = ("clock", "first", "nbytes", "collectives", "dtypes")

    def __init__(self, clock):
        self.clock, self.first, self.nbytes, self.collectives, self.dtypes = clock, None, 0, 0, []

    def count(self, tensor: torch.Tensor) -> None:
        if self.first is None:
            self.first = self.clock.mark()
        self.nbytes += wire_nbytes(tensor)
        self.collectives += 1
        name = str(tensor.dtype).removeprefix("torch.")
        if name not in self.dtypes:
            self.dtypes.append(name)


def _as_current(tap: _BucketTap, fn: Callable, *args):
    """`fn(*args)` with `tap` the current bucket of this thread."""
    before = getattr(_local, "tap", None)
    _local.tap = tap
    try:
        return fn(*args)
    finally:
        _local.tap = before


class _TappedFuture:
    """A collective's future whose `then` callbacks run with its bucket current."""

    def __init__(self, fut: torch.futures.Future, tap: _BucketTap):
        self._fut, self._tap = fut, tap

    def then(self, callback: Callable) -> "_TappedFuture":
        tap = self._tap
        return _TappedFuture(self._fut.then(lambda f: _as_current(tap, callback, f)), tap)

    def __getattr__(self, name: str) -> Any:  # wait, value, done, ...
        return getattr(self._fut, name)


class _TappedWork:
    """A collective's `Work` whose future is a `_TappedFuture`."""

    def __init__(self, work, tap: _BucketTap):
        self._work, self._tap = work, tap

    def get_future(self) -> _TappedFuture:
        return _TappedFuture(self._work.get_future(), self._tap)

    def __getattr__(self, name: str) -> Any:  # wait, is_completed, ...
        return getattr(self._work, name)


def _install_tap() -> None:
    """Wrap `torch.distributed.all_reduce` (once per process) to count what a hook hands it."""
    if getattr(dist.all_reduce, "_ddpviz_tap", False):
        return
    original = dist.all_reduce

    def all_reduce(tensor, *args, **kwargs):
        tap = getattr(_local, "tap", None)
        if tap is None:
            return original(tensor, *args, **kwargs)
        tap.count(tensor)
        work = original(tensor, *args, **kwargs)
        return _TappedWork(work, tap) if work is not None else None

    all_reduce._ddpviz_tap = True
    all_reduce.__wrapped__ = original
    dist.all_reduce = all_reduce


def run_tapped(hook: Callable, state: Any, bucket: dist.GradBucket, clock) -> tuple[torch.futures.Future, _BucketTap]:
    """`hook(state, bucket)` with a new `_BucketTap` current for its call and for every callback it chains on
    its collectives' futures (module docstring), on whatever thread and whenever those run.

    Returns:
        (the future the hook returned, unwrapped for DDP; the tap: `first` (clock mark of the first
        all-reduce, or None), `nbytes`, `collectives`, `dtypes`, complete once that future has).
    """
    _install_tap()
    tap = _BucketTap(clock)
    fut = _as_current(tap, hook, state, bucket)
    return (fut._fut if isinstance(fut, _TappedFuture) else fut), tap


class TimedHook:
    """Runs `hook(state, bucket)` for one bucket inside the recorder's timing (see the module doc).

    Args:
        hook: a DDP comm hook, `(state, GradBucket) -> torch.futures.Future[torch.Tensor]`.
        state: its state (a process group, a `PowerSGDState`, None, ...).
        name: the hook's name in events (`comm_hook`).
        clock: the recorder's clock (`HostClock` or `CudaClock`).
    """

    def __init__(self, hook: Callable, state: Any, name: str, clock):
        self.hook, self.state, self.name, self.clock = hook, state, name, clock

    def __call__(self, bucket: dist.GradBucket, rec: dict[str, Any]) -> torch.futures.Future:
        rec["uncompressed_nbytes"] = rec["nbytes"]
        rec["comm_hook"] = self.name
        fut, tap = run_tapped(self.hook, self.state, bucket, self.clock)

        def done(f: torch.futures.Future):
            value = f.value()
            rec["comm_end"] = self.clock.mark()
            rec["comm_start"] = tap.first if tap.first is not None else rec["ready"]
            rec["nbytes"], rec["collectives"] = tap.nbytes, tap.collectives
            rec["wire_dtype"] = "+".join(tap.dtypes) or None
            rec["compression_ratio"] = rec["uncompressed_nbytes"] / tap.nbytes if tap.nbytes else None
            out = value[0] if isinstance(value, (list, tuple)) else value
            flag = ~torch.isfinite(out).all()  # a tensor: read after the step
            if flag.is_cuda:  # to the host with no wait (bool() of a CUDA tensor synchronises): read once the
                host = torch.empty((), dtype=torch.bool, pin_memory=True)  # step's events completed
                flag = host.copy_(flag, non_blocking=True)
            rec["nonfinite_after_reduce"] = flag
            return value

        return fut.then(done)


def compose(recorder: BucketRecorder, hook: Callable, state: Any, name: str | None = None) -> TimedHook:
    """Make `recorder` run `hook(state, bucket)` for every bucket, inside its timing; returns the
    `TimedHook`. Register the recorder as before (`ddp.register_comm_hook(recorder,
    recording_hook)`). The hook averages (PyTorch's hooks divide by world_size), so
    `recorder.predivided` is set False: the caller must not scale the loss by 1/world_size.

    Raises:
        ValueError: `recorder.overlap` is False (deferring the all-reduces is the recorder's own
            all-reduce; a hook launches its collectives itself).
    """
    if not recorder.overlap:
        raise ValueError("overlap=false cannot be composed with a comm hook: the hook launches its "
                         "collectives itself")
    timed = TimedHook(hook, state, name or getattr(hook, "__name__", "comm hook"), recorder.clock)
    recorder.inner, recorder.predivided = timed, False
    return timed


def selected_hook(cfg: RunConfig, process_group=None) -> tuple[Callable, Any, str] | None:
    """`(hook, state, name)` of the PyTorch hook `cfg.comm_hook` names, None for "none".

    fp16/bf16: `default_hooks.fp16_compress_hook` / `bf16_compress_hook` with the process group as
    state. powersgd: `powerSGD_hook.powerSGD_hook` with `PowerSGDState(process_group,
    matrix_approximation_rank, start_powerSGD_iter)` and PyTorch's other defaults (error feedback,
    warm start, min_compression_rate 2, random_seed 0).
    """
    if cfg.comm_hook == "none":
        return None
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    name = HOOK_NAMES[cfg.comm_hook]
    if cfg.comm_hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group, matrix_approximation_rank=cfg.matrix_approximation_rank,
                                            start_powerSGD_iter=cfg.start_powerSGD_iter)
        return powerSGD_hook.powerSGD_hook, state, name
    return getattr(default_hooks, name), process_group, name


def check_comm_hook(cfg: RunConfig, backend: str | None, rebuilt: list[dict[str, Any]] | None = None) -> None:
    """Refuse, before launch, a comm hook the run's backend cannot run.

    Args:
        rebuilt: DDP's buckets after its rebuild (`engine.modes.ddp.buckets.preview_buckets`'s "rebuilt"),
            the layout PowerSGD compresses.

    Raises:
        PreflightError: field ``comm_hook``: bf16 on a backend other than NCCL (PyTorch's DDP refuses
            `bf16_compress_hook` there, `TORCH_BF16_REFUSAL`); powersgd on gloo with gradients in more than
            one bucket (PyTorch's hook then hangs on gloo: module docstring).
    """
    if cfg.comm_hook == "powersgd" and backend == "gloo" and rebuilt and len(rebuilt) > 1:
        total = sum(b["nbytes"] for b in rebuilt)
        need = max(1, -(-total // (1 << 20)))  # MiB, rounded up; not 25 itself (DDP then keeps a 1 MiB first bucket)
        need = need + 1 if need == 25 else need
        raise PreflightError("comm_hook", f"comm_hook 'powersgd' on gloo needs DDP's gradients in one bucket; this "
                             f"run's would be in {len(rebuilt)} (bucket_cap_mb={cfg.bucket_cap_mb:g}, {total:,} B of "
                             f"gradients). PyTorch's powerSGD_hook waits for its next all-reduce inside gloo's "
                             f"callback threads, so with two buckets or more the run hangs at the first compressed "
                             f"step. Use bucket_cap_mb={need} or more, comm_hook 'fp16', or NCCL")
    if cfg.comm_hook == "bf16" and backend != "nccl":
        raise PreflightError("comm_hook", f"comm_hook 'bf16' needs backend 'nccl' on CUDA (this run's backend is "
                             f"{backend}); PyTorch refuses bf16_compress_hook otherwise: "
                             f"\"{TORCH_BF16_REFUSAL}\". Use comm_hook 'fp16' (halves the bytes too) or 'powersgd'")


def volume_label(recorder: BucketRecorder) -> str:
    """The `comm_volume` event's `volume_source` for this recorder's bytes."""
    inner = getattr(recorder, "inner", None)
    if inner is None:
        return "derived (ring all-reduce)"
    return f"derived (ring all-reduce) from the tensors {inner.name} handed to all-reduce"
