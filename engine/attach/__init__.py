"""Attach: instrument a training script ddpviz did not launch (`ddpviz run -- torchrun ... train.py`).

The launcher (`workers.cli.attach`) runs the user's command with `startup/` first on PYTHONPATH
and the run's variables in the environment (`env`); `startup/sitecustomize.py` runs in every
Python process the command starts and has `install` called in the training processes only
(`claim`: once the script imports torch, or once it initialises a process group). `install`
patches what the script will build, when it builds it, and emits the same events a launched run
does (docs/events.md) into this process's spool file, which the launcher forwards to Redis.

    env       the variables the launcher sets and the hook reads; who is instrumented (no torch)
    claim     how a process becomes an instrumented rank: at torch's import, or at init_process_group
    startup/  sitecustomize.py: the start-up hook (a sys.path folder, not a package)
    session   one instrumented process: identity from torchrun's env or the process group, its event file, the guard
    ddp       each DistributedDataParallel: the comm hook (wrapping the script's), forward, no_sync
    dp        each nn.DataParallel: on CUDA its broadcast/scatter/forward/gather/loss/backward/reduce phases
    fsdp      each FSDP2 module (fully_shard): its forward, the units' all-gathers and reduce-scatters
    imports   a callback after a module's first import (FSDP2 is patched only if the script imports it)
    probe     `ddpviz run --probe`: the all-reduce probe on the script's process group after its last step
    comm      `timed_comm_hook`, the one function DDP calls per bucket, and the all_reduce tap
    nohook    which DDPs go without a comm hook (`--bucket-timing`), and their buckets from the reducer and recorders
    volume    the process's one `comm_volume` a step, over all its DDPs
    steps     steps from the optimizer step hooks or explicit calls: the step split, loss, samples, micro-steps
    step_events  a step event's fields and sources, and an ordinary step's events built on the writer's thread
    api       what the public `ddpviz` package (watch, step) calls: a model registered by hand, explicit steps
    started   `run_started` of an attached run (rank 0)
    memory    the memory sampler and live-tensor ledger on sampled steps
    errors    the failing rank's exception into torchrun's error file, and timed to the ns into the spool
    overrides `ddpviz tune`'s trial settings: DDP arguments at construction, a comm hook, the stop after N steps
    transparent  the constructors ddpviz wraps warn at the script's line, as without ddpviz

Fail open: every hook runs under `Session.guard`; an error switches that part off, is said once,
and training goes on. Nothing here touches the network.
"""

from __future__ import annotations

_SESSION = None
_FAILED: BaseException | None = None  # why install failed (it is not tried twice: it may have patched half)


def installed():
    """This process's `engine.attach.session.Session`, or None before `install`."""
    return _SESSION


def install(env=None):
    """Instrument this process (idempotent). Returns the `engine.attach.session.Session`, which
    also holds `tracker` (`steps.StepTracker`), `started` and `memory`.

    `env`: the variables the session reads its identity from (default: os.environ); the first
    call's are kept.

    Raises:
        KeyError: `env` lacks the run's variables (`engine.attach.env.RUN_ID_ENV`, `SPOOL_ENV`).
        OSError: the spool folder cannot be written.
        RuntimeError: an earlier call failed (its exception is the cause).
    """
    global _SESSION, _FAILED
    if _SESSION is not None:
        return _SESSION
    if _FAILED is not None:
        raise RuntimeError(f"ddpviz instrumentation failed earlier in this process "
                           f"({type(_FAILED).__name__}: {_FAILED})") from _FAILED
    try:
        _SESSION = _install(env)
    except Exception as exc:
        _FAILED = exc
        raise
    return _SESSION


def _install(env):
    import atexit
    import gc
    import os
    import sys

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    from ddpviz.engine.attach.ddp import patch_ddp
    from ddpviz.engine.attach.dp import patch_data_parallel
    from ddpviz.engine.modes.ddp.sampled import watch_script_profiler
    from ddpviz.engine.attach.fsdp import patch_fsdp
    from ddpviz.engine.attach.errors import install_excepthook, note_exit
    from ddpviz.engine.attach.env import PROBE_ENV
    from ddpviz.engine.attach.memory import MemoryWatch
    from ddpviz.engine.attach.probe import ProbeAtEnd
    from ddpviz.engine.attach.session import Session
    from ddpviz.engine.attach.started import StartedEmitter
    from ddpviz.engine.attach.steps import COMPILED, COMPILED_NOTE, StepTracker

    s = Session(env)
    tracker = StepTracker(s)
    started = StartedEmitter(s, tracker)
    memory = MemoryWatch(s, tracker)
    s.tracker, s.started, s.memory = tracker, started, memory

    def on_step(step: int, fields: dict) -> None:
        s.guard("run_started", started.on_step, step, fields)

    tracker.on_step = on_step
    tracker.memory = memory
    patch_ddp(s, tracker)
    patch_fsdp(s, tracker)
    patch_data_parallel(s, tracker)
    s.guard("profiler", watch_script_profiler)  # the script's own profiler first (engine.modes.ddp.sampled)

    torch.Tensor.backward = _as_backward(s, tracker, torch.Tensor.backward)
    # `torch.autograd.backward(tensors, ...)` is a backward too (`Tensor.backward` calls it: the
    # tracker counts the pair once)
    torch.autograd.backward = _as_backward(s, tracker, torch.autograd.backward)
    _patch_grad_scaler(s, tracker)
    register_optimizer_step_pre_hook(lambda opt, a, k: s.guard("steps", tracker.optimizer_start, opt))
    register_optimizer_step_post_hook(lambda opt, a, k: s.guard("steps", tracker.optimizer_end, opt))
    # the rank of an exception: a process that wrote events, or one its launcher gave a RANK (a torchrun worker),
    # before its first event too (an exception before any step was the run's error with rank null, though torchrun
    # named the rank); not a launcher that trained nothing (`accelerate launch` itself)
    given_rank = (os.environ if env is None else env).get("RANK") is not None
    uncaught_at_exit = install_excepthook(lambda: s.rank if s.trained or given_rank else None, s.spool)
    probe = None
    if (os.environ if env is None else env).get(PROBE_ENV) == "1":
        probe = ProbeAtEnd(s, tracker)
        probe.install()

    def at_exit() -> None:
        s.guard("ending", uncaught_at_exit)  # an exception the script's own sys.excepthook took instead of ddpviz's
        if s.trained or given_rank:  # the moment this rank's Python exited (engine.attach.errors.note_exit)
            s.guard("ending", note_exit, s.spool, s.rank)
        if COMPILED:  # the script compiled a watched module: its forwards were not timed (say so, once)
            s.note(COMPILED_NOTE)
        if probe is not None:
            s.guard("probe", probe.at_exit)
        s.guard("steps", tracker.close)
        tracker.stop_profiling()  # whatever is switched off (it catches its own errors)
        s.guard("run_started", started.at_exit)
        s.guard("memory", memory.close)
        s.guard("steps", tracker.release)
        # the DDP <-> watch cycles (its forward hooks are the watch's methods), so a DDP the script dropped goes now;
        # not after an uncaught exception (Python set sys.last_value before any excepthook): its traceback holds the
        # script's frames, and with them its DDP, until finalization, as without ddpviz; and a full collection (170-220
        # ms with torch loaded, 2026-12-06) kept a crashed rank alive until torchrun's SIGTERM for its failed peer
        # reached it, which ran the script's own SIGTERM handler, 3 of 3 times (never without ddpviz; a new user)
        if getattr(sys, "last_value", None) is None:
            gc.collect()
        s.close()

    atexit.register(at_exit)
    return s


def _as_backward(s, tracker, backward):
    """`backward` (``Tensor.backward`` or ``torch.autograd.backward``; its first argument the
    tensor(s)) with the tracker told when it starts and ends, under the fail-open guard."""
    import functools

    import torch

    @functools.wraps(backward)
    def timed_backward(tensors, *args, **kwargs):
        if not isinstance(tensors, (torch.Tensor, list, tuple)):  # an iterable torch reads once (a generator)
            tensors = tuple(tensors)
        m = s.guard("steps", tracker.backward_start, tensors)
        try:
            return backward(tensors, *args, **kwargs)
        finally:
            if m is not None:
                s.guard("steps", tracker.backward_end, m)

    return timed_backward


def _patch_grad_scaler(s, tracker) -> None:
    """`GradScaler.scale(loss)`: the tracker records `loss`, not the scaled tensor backward() gets
    (`torch.amp.GradScaler`, which `torch.cuda.amp.GradScaler` subclasses)."""
    import functools

    import torch

    cls = getattr(getattr(torch.amp, "grad_scaler", None), "GradScaler", None)
    if cls is None:
        return
    scale = cls.scale

    @functools.wraps(scale)
    def scale_and_note(self, outputs, *args, **kwargs):
        out = scale(self, outputs, *args, **kwargs)
        if isinstance(outputs, torch.Tensor) and isinstance(out, torch.Tensor) and out is not outputs:
            s.guard("steps", tracker.note_scaled, out, outputs)
        return out

    cls.scale = scale_and_note
