"""Memory readings that are cheap enough for a timer: process RSS, the CUDA allocator, NVML.

- `process_rss_bytes`: resident set size of this process (psutil), the memory a CPU rank holds.
- `cuda_allocator`: `torch.cuda.memory_allocated/reserved/max_memory_allocated` of one device
  (PyTorch's caching allocator, torch/cuda/memory.py).
- `NvmlReader`: NVML's used memory of the *same physical GPU* as a CUDA ordinal. Under a lease
  `CUDA_VISIBLE_DEVICES` holds GPU UUIDs, and CUDA's ordinals (fastest first by default, or the
  order of that list) are not NVML's indices (PCI bus order), so the GPU is found by UUID:
  `torch.cuda.get_device_properties(i).uuid` (printed as 8-4-4-4-12 hex, torch/csrc/cuda/Module.cpp)
  is NVML's ``GPU-<uuid>`` (``MIG-<uuid>`` for a MIG instance), given to
  `pynvml.nvmlDeviceGetHandleByUUID`.

The bytes of tensors each device holds come from `engine.measure.ledger`; the timer and the memory events
from `engine.measure.memory_sampler`.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable

import torch
import torch.nn as nn


def tensor_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Sum of numel * element_size over the tensors (None skipped)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def param_bytes(model: nn.Module) -> int:
    return tensor_bytes(model.parameters())


def optimizer_state_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The tensors in the optimizer's state (AdamW: exp_avg, exp_avg_sq, step; SGD: none)."""
    return [v for st in opt.state.values() for v in st.values() if torch.is_tensor(v)]


def optimizer_state_bytes(opt: torch.optim.Optimizer) -> int:
    return tensor_bytes(optimizer_state_tensors(opt))


_process = None


def process_rss_bytes() -> int | None:
    """Resident set size of this process in bytes (psutil), None if psutil cannot read it."""
    global _process
    try:
        import psutil

        if _process is None:
            _process = psutil.Process()
        return int(_process.memory_info().rss)
    except Exception:
        return None


def cuda_allocator(index: int) -> dict[str, int]:
    """{allocated, reserved, peak} bytes of CUDA device `index` from PyTorch's caching allocator."""
    return dict(allocated=int(torch.cuda.memory_allocated(index)),
                reserved=int(torch.cuda.memory_reserved(index)),
                peak=int(torch.cuda.max_memory_allocated(index)))


def cuda_uuid(index: int) -> str:
    """The UUID CUDA reports for ordinal `index` (8-4-4-4-12 hex, no prefix)."""
    return str(torch.cuda.get_device_properties(index).uuid)


class NvmlReader:
    """NVML figures of the physical GPU behind each CUDA ordinal, matched by UUID.

    Args:
        nvml: the `pynvml` module (nvidia-ml-py), or a stand-in with `nvmlInit`,
            `nvmlDeviceGetHandleByUUID`, `nvmlDeviceGetMemoryInfo` (tests pass a fake).
        uuid_of: CUDA ordinal -> CUDA's UUID string (default `cuda_uuid`).

    Every failure (no NVML, no such UUID) gives None, never an exception: NVML is an extra figure.
    """

    def __init__(self, nvml: Any = None, uuid_of: Callable[[int], str] = cuda_uuid):
        self._nvml, self._uuid_of = nvml, uuid_of
        self._handles: dict[int, Any] = {}
        self._ready: bool | None = None
        self._lock = threading.Lock()

    def _init(self) -> bool:
        with self._lock:
            if self._ready is None:
                try:
                    if self._nvml is None:
                        import pynvml  # provided by the nvidia-ml-py distribution

                        self._nvml = pynvml
                    self._nvml.nvmlInit()
                    self._ready = True
                except Exception:
                    self._ready = False
            return self._ready

    def handle(self, index: int) -> Any:
        """NVML handle of CUDA ordinal `index`'s GPU, or None."""
        if index in self._handles:
            return self._handles[index]
        found = None
        if self._init():
            uuid = self._uuid_of(index)
            names = [uuid] if uuid.startswith(("GPU-", "MIG-")) else [f"GPU-{uuid}", f"MIG-{uuid}"]
            for name in names:
                try:
                    found = self._nvml.nvmlDeviceGetHandleByUUID(name)
                    break
                except Exception:
                    continue
        self._handles[index] = found
        return found

    def used_bytes(self, index: int) -> int | None:
        """Device-wide used memory (bytes) of CUDA ordinal `index`'s GPU: every process on it."""
        h = self.handle(index)
        if h is None:
            return None
        try:
            return int(self._nvml.nvmlDeviceGetMemoryInfo(h).used)
        except Exception:
            return None


_default_nvml = NvmlReader()


def cuda_event(device: torch.device, breakdown: dict[str, int] | None = None) -> dict[str, Any]:
    """Fields of a one-off `memory` event for a CUDA device (allocator + NVML by UUID).

    Kept for `engine.modes.dp.cuda`, which has no `MemorySampler` yet; `source` names where
    `allocated_bytes` comes from (the CUDA caching allocator)."""
    idx = device.index or 0
    alloc = cuda_allocator(idx)
    return dict(allocated_bytes=alloc["allocated"], reserved_bytes=alloc["reserved"],
                peak_allocated_bytes=alloc["peak"], used_bytes=_default_nvml.used_bytes(idx),
                source="cuda", breakdown={k: int(v) for k, v in (breakdown or {}).items()})
