"""Which devices a run uses, checked before any process starts.

`device=auto` takes CUDA when `world_size` GPUs are visible, else virtual CPU devices
(`cpu:0..N-1`). DP on CPU is an emulation (threads and real copies on one host); DDP on CPU is
real DDP on gloo with one process per rank.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any

import torch

from ddpviz.engine.config import RunConfig, dp_cuda_fault_error


class PreflightError(ValueError):
    """A setting cannot run here; `field` names the RunConfig field at fault."""

    def __init__(self, field_name: str, message: str):
        self.field = field_name
        super().__init__(message)


@dataclass
class DevicePlan:
    """Resolved devices: `names[i]` is device i (DP) or rank i's device (DDP)."""

    kind: str  # "cpu" or "cuda"
    names: list[str]
    backend: str | None  # process-group backend for DDP and FSDP, None otherwise
    emulated: bool  # DP on virtual CPU devices
    infos: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(kind=self.kind, names=self.names, backend=self.backend, emulated=self.emulated)


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def available_memory(plan: DevicePlan) -> dict[str, int]:
    """What `engine.components.preflight.check_model_fits` weighs a model against: ``{"host": bytes the host
    can give without swapping (psutil's virtual_memory().available: Linux's MemAvailable)}`` plus, on CUDA, each
    device name's total memory (from `resolve_plan`'s infos: no new CUDA call)."""
    import psutil

    out = {"host": int(psutil.virtual_memory().available)}
    if plan.kind == "cuda":
        out.update({name: int(info["total_memory_bytes"]) for name, info in zip(plan.names, plan.infos)})
    return out


def resolve_plan(cfg: RunConfig) -> DevicePlan:
    """Pick devices and backend for `cfg`.

    Raises:
        PreflightError: CUDA asked for but missing, fewer GPUs than `world_size`, NCCL on CPU, or
            a fault under DP on CUDA (`engine.config.dp_cuda_fault_error`).
    """
    n = 1 if cfg.mode == "single" else cfg.world_size // cfg.nnodes  # devices on this host
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if cfg.device == "cuda" and gpus < n:
        raise PreflightError("world_size" if gpus else "device",
                             f"device 'cuda' with world_size {n} needs {n} CUDA devices; {gpus} visible")
    kind = "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and gpus >= n) else "cpu"
    backend = None
    if cfg.mode in ("ddp", "fsdp"):  # a process group per run: one rank process per device
        backend = cfg.backend if cfg.backend != "auto" else ("nccl" if kind == "cuda" else "gloo")
        if backend == "nccl" and kind != "cuda":
            raise PreflightError("backend", "backend 'nccl' needs CUDA devices; use 'gloo' on CPU")
    if kind == "cuda" and (msg := dp_cuda_fault_error(cfg)):
        raise PreflightError("fault", msg)
    if kind == "cuda":
        names = [f"cuda:{i}" for i in range(n)]
        infos = [dict(name=torch.cuda.get_device_name(i), kind="cuda",
                      total_memory_bytes=torch.cuda.get_device_properties(i).total_memory) for i in range(n)]
    else:
        names = [f"cpu:{i}" for i in range(n)]
        infos = [dict(name=f"virtual CPU device {i} ({socket.gethostname()})", kind="cpu",
                      total_memory_bytes=host_memory_bytes()) for i in range(n)]
    return DevicePlan(kind, names, backend, emulated=(cfg.mode == "dp" and kind == "cpu"), infos=infos)
