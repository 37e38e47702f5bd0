"""`ddpviz tune`'s trial settings, applied inside an attached rank (`workers.cli.tune` sets them).

Three variables, all optional; without them this module changes nothing:

- `DDP_KWARGS_ENV` (JSON object): merged into the arguments of every `DistributedDataParallel`
  the script builds, over the script's own (given by keyword or by position). Only `KNOBS`
  are taken; any other key, or a value of the wrong type, raises `ValueError` naming it, in
  the DDP constructor (so the trial fails and says why, never runs unlabelled).
- `COMM_HOOK_ENV`: "fp16", "bf16" or "powersgd": that comm hook is registered on each DDP right
  after it is built (through the attach's own `register_comm_hook`, so buckets stay timed).
  These change the numbers (compression), which is why tune only tries them when asked.
- `STOP_AFTER_ENV` (int N >= 1): after the step event of the N-th optimizer step (step index
  N-1, `engine.attach.steps`), every rank writes its "stop" record (below), waits at a barrier of the
  default process group (every rank stops at the same point of the script), flushes its event
  file and ends with `os._exit(0)`: no code of the script runs after that step (no checkpoint,
  no report, no `destroy_process_group`), and torchrun sees every worker exit 0.

Their records are `log` events (level "info") with a `tune` field: "ddp" for each DDP built
(`ddp_kwargs`: the arguments applied; `settings`: the DDP's own after them, so a baseline's are
the script's choice; `bucket_bytes_cap`; `has_buffers`: `broadcast_buffers` matters only then;
`param_nbytes`: the bytes of each parameter that requires grad, in `module.parameters()` order,
from which `engine.tune` works out the bucket layout of another cap), and "stop" when a rank
ends its trial (`step`, `how`).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
from typing import Any

from ddpviz.engine.attach.transparent import past_wrappers, wrapper

DDP_KWARGS_ENV = "DDPVIZ_TUNE_DDP_KWARGS"
COMM_HOOK_ENV = "DDPVIZ_TUNE_COMM_HOOK"
STOP_AFTER_ENV = "DDPVIZ_TUNE_STOP_AFTER"
KNOBS = {"bucket_cap_mb": (int, float), "gradient_as_bucket_view": (bool,), "static_graph": (bool,),
         "broadcast_buffers": (bool,)}
COMM_HOOKS = ("fp16", "bf16", "powersgd")
STOP_HOW = "os._exit(0) on every rank after a barrier, right after the step's event"


def ddp_kwargs(env: dict[str, str]) -> dict[str, Any]:
    """The DDP arguments `env` asks for ({} when unset).

    Raises:
        ValueError: not a JSON object, a key outside `KNOBS`, a value of the wrong type, or
            bucket_cap_mb <= 0 (each names the key).
    """
    raw = env.get(DDP_KWARGS_ENV, "")
    if not raw:
        return {}
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{DDP_KWARGS_ENV} must be a JSON object ({exc})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{DDP_KWARGS_ENV} must be a JSON object (got {type(obj).__name__})")
    for key, value in obj.items():
        if key not in KNOBS:
            raise ValueError(f"{DDP_KWARGS_ENV}: {key!r} is not a knob tune sets (one of {sorted(KNOBS)})")
        types = KNOBS[key]
        if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
            raise ValueError(f"{DDP_KWARGS_ENV}: {key} must be {'/'.join(t.__name__ for t in types)} (got {value!r})")
    if "bucket_cap_mb" in obj and not obj["bucket_cap_mb"] > 0:
        raise ValueError(f"{DDP_KWARGS_ENV}: bucket_cap_mb must be > 0 (got {obj['bucket_cap_mb']})")
    return obj


def stop_after(env: dict[str, str]) -> int | None:
    """N from `STOP_AFTER_ENV`, or None. Raises ValueError unless it is a whole number >= 1."""
    raw = env.get(STOP_AFTER_ENV, "")
    if not raw:
        return None
    if not raw.strip().isdigit() or int(raw) < 1:
        raise ValueError(f"{STOP_AFTER_ENV} must be a whole number >= 1 (got {raw!r})")
    return int(raw)


def _hook(name: str, process_group: Any):
    """(state, hook) of PyTorch's comm hook `name` (torch.distributed.algorithms.ddp_comm_hooks)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if name == "fp16":
        return process_group, default_hooks.fp16_compress_hook
    if name == "bf16":
        return process_group, default_hooks.bf16_compress_hook
    if name == "powersgd":  # rank 1, PowerSGD from the third step (two steps of plain all-reduce first)
        state = powerSGD_hook.PowerSGDState(process_group=process_group, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2)
        return state, powerSGD_hook.powerSGD_hook
    raise ValueError(f"{COMM_HOOK_ENV} must be one of {COMM_HOOKS} (got {name!r})")


def _tune_ddp_event(session: Any, ddp: Any, applied: dict[str, Any], hook: str | None) -> None:
    module = ddp.module
    from ddpviz.engine.modes.ddp.buckets import cap_mb_of

    settings = dict(bucket_cap_mb=cap_mb_of(int(ddp.bucket_bytes_cap)), first_bucket_bytes=_first_bucket_bytes(ddp),
                    gradient_as_bucket_view=bool(ddp.gradient_as_bucket_view), static_graph=bool(ddp.static_graph),
                    broadcast_buffers=bool(ddp.broadcast_buffers),
                    find_unused_parameters=bool(ddp.find_unused_parameters))
    session.emit("log", level="info", tune="ddp",
                 message=f"ddpviz tune: DDP built with {applied or 'its own arguments'}"
                         + (f" and the {hook} comm hook" if hook else ""),
                 ddp_kwargs=applied, comm_hook=hook, settings=settings, bucket_bytes_cap=int(ddp.bucket_bytes_cap),
                 has_buffers=any(True for _ in module.buffers()), backend=_backend(ddp),
                 param_nbytes=[p.numel() * p.element_size() for p in module.parameters() if p.requires_grad],
                 source="measured: the DDP the script built, after tune's arguments")


def _backend(ddp: Any) -> str | None:
    """The DDP's process group's backend ("gloo", "nccl"), None where it cannot be read."""
    try:
        import torch.distributed as dist

        return str(dist.get_backend(ddp.process_group))
    except Exception:  # noqa: BLE001 - fail open: a record without it skips no candidate
        return None


def _first_bucket_bytes(ddp: Any) -> int:
    """The first bucket's cap DDP uses (1 MiB when the script left bucket_cap_mb unset, torch >= 2.x
    `_DEFAULT_FIRST_BUCKET_BYTES`; else the cap)."""
    import torch.distributed as dist

    default = bool(getattr(ddp, "bucket_bytes_cap_default", False))
    return int(dist._DEFAULT_FIRST_BUCKET_BYTES) if default else int(ddp.bucket_bytes_cap)


def wrap_ddp_init(session: Any, env: dict[str, str]) -> None:
    """Wrap `DistributedDataParallel.__init__` (already wrapped by `engine.attach.ddp.patch_ddp`)
    so it takes `ddp_kwargs(env)` and, after it is built and watched, the comm hook."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    applied, hook = ddp_kwargs(env), env.get(COMM_HOOK_ENV) or None
    if hook is not None and hook not in COMM_HOOKS:
        raise ValueError(f"{COMM_HOOK_ENV} must be one of {COMM_HOOKS} (got {hook!r})")
    init = DDP.__init__
    signature = inspect.signature(init)

    @wrapper
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.arguments.update(applied)  # over the script's own, keyword or positional
        with past_wrappers(init):  # DDP's warnings name the script's line (engine.attach.transparent)
            init(*bound.args, **bound.kwargs)
        if hook is not None:
            self.register_comm_hook(*_hook(hook, self.process_group))
        session.guard("tune", _tune_ddp_event, session, self, applied, hook)

    DDP.__init__ = __init__


def stop_at_step(session: Any, tracker: Any, n: int) -> None:
    """After the step event of step index n-1, end this rank (see the module docstring)."""
    on_step = tracker.on_step

    def stopping(step: int, fields: dict) -> None:
        if on_step is not None:
            on_step(step, fields)
        if step + 1 >= n:
            _stop(session, tracker, step)

    tracker.on_step = stopping


def _stop(session: Any, tracker: Any, step: int) -> None:
    import torch.distributed as dist

    session.guard("tune", session.emit, "log", level="info", message=f"ddpviz tune: trial ended after step {step}",
                  tune="stop", step=step, how=STOP_HOW)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    session.guard("steps", tracker.close)
    if session.started is not None:
        session.guard("run_started", session.started.at_exit)
    if session.memory is not None:
        session.guard("memory", session.memory.close)
    session.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def apply_tune(session: Any, tracker: Any, env: dict[str, str] | None = None) -> None:
    """Install what `env` (default os.environ) asks for; nothing when no tune variable is set.

    Raises:
        ValueError: a tune variable that does not parse (named).
    """
    env = dict(os.environ if env is None else env)
    if not any(env.get(k) for k in (DDP_KWARGS_ENV, COMM_HOOK_ENV, STOP_AFTER_ENV)):
        return
    wrap_ddp_init(session, env)
    n = stop_after(env)
    if n is not None:
        stop_at_step(session, tracker, n)
