"""`run_started` of an attached run: what rank 0 can tell of the script's run.

Emitted by rank 0 once its second step has ended (so the bucket preview holds the layout after
DDP's rebuild), or at exit when the script ran fewer steps. Fields are those of a launched run
(docs/events.md) where the script's run has them, else null, plus `attached: true`, `command`
(the command `ddpviz run` ran), `script` (the training script's file), `nnodes`, `node`, and
`label` (the `name` given to `ddpviz.watch()`, else null).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

import torch
import torch.distributed as dist

from ddpviz.engine.attach.env import COMMAND_ENV
from ddpviz.engine.attach.session import Session
from ddpviz.engine.config import SCHEMA_VERSION


def script_name() -> str | None:
    """The file the training process runs (sys.argv[0]), or `-m module`'s file."""
    arg0 = sys.argv[0] if sys.argv else ""
    return os.path.basename(arg0) if arg0 and arg0 != "-c" else None


def started_fields(s: Session, watch: Any, first_step: dict | None) -> dict[str, Any]:
    """The `run_started` fields (see the module docstring). `watch`: the first DDP's
    `engine.attach.ddp.Watch` or the `engine.attach.fsdp.FsdpWatch` (mode "fsdp", with
    `fsdp_units`), else the first model `ddpviz.watch()` registered
    (`engine.attach.api.ModuleWatch`), or None; `first_step`: the fields of step 0's event, or None."""
    try:
        command = json.loads(os.environ.get(COMMAND_ENV, "null"))
    except ValueError:
        command = None
    kind = watch.device.type if watch is not None else "cpu"
    backend = dist.get_backend() if dist.is_available() and dist.is_initialized() else None
    first = first_step or {}
    per_rank = (first.get("samples") or 0) // max(1, s.world_size) // max(1, first.get("micro_steps", 1))
    names = ([f"cuda:{r % s.local_world_size}" for r in range(s.world_size)] if kind == "cuda"
             else [f"cpu:{r}" for r in range(s.world_size)])
    devices = [dict(name=n, kind=kind, total_memory_bytes=(
        torch.cuda.get_device_properties(watch.device).total_memory if kind == "cuda" else None))
        for n in names]
    model = watch.module if watch is not None else None
    params = [p for p in model.parameters()] if model is not None else []
    ddp = getattr(watch, "ddp", None)
    own = watch.started_fields() if hasattr(watch, "started_fields") else {}  # FSDP2: mode, fsdp_units
    mode = own.pop("mode", None) or ("ddp" if ddp is not None else "single")
    from ddpviz.engine.modes.ddp.buckets import cap_mb_of  # here, once a run starts: not in every process's start-up

    config = dict(mode=mode, world_size=s.world_size,
                  steps=None, model=type(model).__name__ if model is not None else None,
                  dataset=None, device=kind, backend=backend, global_batch_size=(first_step or {}).get("samples"),
                  bucket_cap_mb=cap_mb_of(int(ddp.bucket_bytes_cap)) if ddp is not None else None,
                  **dict(zip(("overlap", "overlap_source"), overlap_of(watch))),
                  gradient_as_bucket_view=getattr(ddp, "gradient_as_bucket_view", None),
                  static_graph=getattr(ddp, "static_graph", None),
                  find_unused_parameters=getattr(ddp, "find_unused_parameters", None),
                  broadcast_buffers=getattr(ddp, "broadcast_buffers", None),
                  comm_hook=_hook_name(watch), attached=True)
    out = dict(schema_version=SCHEMA_VERSION, config=config, mode=config["mode"], world_size=s.world_size,
               backend=backend, devices=devices, device_names=names, emulated=False,
               torch_version=torch.__version__, host=s.hostname, hostname=socket.gethostname(),
               dataset_name=None, param_count=sum(p.numel() for p in params),
               grad_bytes=sum(p.numel() * p.element_size() for p in params if p.requires_grad),
               micro_batch_per_device=per_rank or None, host_cpu_count=os.cpu_count(),
               cpu_threads_per_device=torch.get_num_threads() if kind == "cpu" else None,
               sampler=None, train_samples=None, val_samples=None,
               attached=True, command=command, script=script_name(),
               nnodes=max(1, s.world_size // max(1, s.local_world_size)), node=s.node,
               label=s.label)
    if ddp is not None:
        out["bucket_preview"] = watch.preview()
    out.update(own)
    return out


# hooks that hand each bucket to all-reduce as soon as DDP gives it (torch's default_hooks and
# powerSGD_hook launch their collective inside the call; DDP calls the hook when the bucket is ready)
IMMEDIATE_HOOKS = ("allreduce_hook", "fp16_compress_hook", "bf16_compress_hook", "powerSGD_hook",
                   "batched_powerSGD_hook")


def overlap_of(watch: Any) -> tuple[bool | None, str | None]:
    """Whether the script's DDP starts a bucket's all-reduce before the backward's last bucket is
    ready (`overlap`, as a launched run's setting means it), and how that is known.

    Measured when the latest emitted synced backward had two or more buckets whose all-reduce
    start was seen (`engine.attach.comm`: DDP's own path, or a script hook's call of
    `torch.distributed.all_reduce` for that bucket; a bucket whose hook called none has its start
    set to its ready time, `nbytes_source` saying so, and is left out): True when one began before
    the last bucket's `ready_s`, False when none did (every bucket held until the last, as a
    launched run's `overlap=false`). Else derived from the hook: DDP's own all-reduce or a torch
    hook in IMMEDIATE_HOOKS launches each bucket when it is ready (True); another hook of the
    script's gives None (a hook that holds the buckets and all-reduces them together in the last
    call cannot be told apart from one that does not). Not a DDP: (None, None).
    """
    if getattr(watch, "ddp", None) is None:
        return None, None
    timed = [b for b in getattr(watch, "last_buckets", []) or []
             if b.get("ready_s") is not None and b.get("comm_start_s") is not None
             and "handed no tensor" not in (b.get("nbytes_source") or "")]
    if len(timed) >= 2:
        last_ready = max(b["ready_s"] for b in timed)
        early = any(b["comm_start_s"] < last_ready for b in timed)
        return early, (f"measured: {len(timed)} buckets of the latest synced backward; an all-reduce "
                       f"{'began' if early else 'never began'} before the last bucket was ready")
    hook = _hook_name(watch)
    if hook is None or hook.rsplit(".", 1)[-1] in IMMEDIATE_HOOKS:
        return True, (f"derived: {hook or 'DDP (no comm hook)'} starts each bucket's all-reduce when "
                      "DDP hands it the ready bucket (fewer than two timed buckets to measure yet)")
    return None, f"unknown: the script's comm hook {hook} and fewer than two timed buckets to measure"


def _hook_name(watch: Any) -> str | None:
    if getattr(watch, "ddp", None) is None:
        return None
    hook = watch.state.user_hook
    nohook = getattr(watch, "nohook", None)
    if hook is None and nohook is not None:  # no hook of ddpviz's: the script's own as DDP runs it (a built-in)
        return nohook.script_hook
    return getattr(hook, "__qualname__", repr(hook)) if hook is not None else None


class StartedEmitter:
    """Emits `run_started` once, from rank 0: after step 1, or from `at_exit`."""

    AFTER_STEP = 1

    def __init__(self, s: Session, tracker: Any):
        self.s, self.tracker = s, tracker
        self.done = s.rank != 0
        self.first_step: dict | None = None

    def on_step(self, step: int, fields: dict) -> None:
        if step == 0:
            self.first_step = fields
        if step >= self.AFTER_STEP:
            self.emit()

    def emit(self) -> None:
        if self.done:
            return
        self.done = True
        watches = self.tracker.watches or self.tracker.modules
        watch = watches[0] if watches else None
        self.s.emit("run_started", **started_fields(self.s, watch, self.first_step))

    def at_exit(self) -> None:
        if self.tracker.step > 0 or self.tracker.watches:
            self.emit()
