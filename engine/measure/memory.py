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


def cuda_event(device: torch.device, breakdown: dict[str, int] | None = None,
               start: tuple[int, int] | None = None) -> dict[str, Any]:
    """Fields of a one-off `memory` event for a CUDA device (allocator + NVML by UUID).

    Kept for `engine.modes.dp.cuda`, which has no `MemorySampler` yet; `source` names where
    `allocated_bytes` comes from (the CUDA caching allocator). `start`: (bytes held at the step's
    start, bytes of the training's tensors then), when the peak was reset at that start: adds
    `step_memory_parts` (the library's floor and the training's peak)."""
    idx = device.index or 0
    alloc = cuda_allocator(idx)
    out = dict(allocated_bytes=alloc["allocated"], reserved_bytes=alloc["reserved"],
               peak_allocated_bytes=alloc["peak"], used_bytes=_default_nvml.used_bytes(idx),
               source="cuda", breakdown={k: int(v) for k, v in (breakdown or {}).items()})
    if start is not None:
        out.update(step_memory_parts(start[0], alloc["peak"], start[1]))
    return out


# ---- a CUDA step's peak, split into the library's floor and the training's own (issue 31) -----
# The CUDA caching allocator rounds every block up to a multiple of 512 B (kMinBlockSize,
# c10/cuda/CUDACachingAllocator.cpp), so a tensor of n bytes holds at least that rounded size.
ALLOCATOR_BLOCK_BYTES = 512


def allocator_rounded_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes the CUDA caching allocator holds for `tensors`: each distinct storage's nbytes rounded
    up to `ALLOCATOR_BLOCK_BYTES` (views of one storage counted once; None skipped)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None:
            st = t.untyped_storage()
            seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
    block = ALLOCATOR_BLOCK_BYTES
    return sum(-(-n // block) * block for n in seen.values())


def step_memory_parts(held_at_start_bytes: int, peak_bytes: int, training_at_start_bytes: int) -> dict[str, int]:
    """Split one device's step peak (CUDA allocator) into the library's floor and the training's part.

    On CUDA the allocator's `memory_allocated` also counts what libraries allocate through it and
    keep: cuBLAS's workspace per handle and stream (32 MiB each on Hopper in torch 2.11; four of them
    made DP's per-step peak 137,560,064 B on an H200 for a ~36 KB model, issue 31). Those bytes are
    held when a step begins and no training tensor accounts for them.

    Args:
        held_at_start_bytes: `torch.cuda.memory_allocated` at the step's start, read right after
            `reset_peak_memory_stats` (so the step's peak can be no lower).
        peak_bytes: `torch.cuda.max_memory_allocated` after the step (its peak since that reset).
        training_at_start_bytes: bytes the training's own tensors held at that start (parameters,
            buffers, gradients, optimizer state; `allocator_rounded_bytes`, or the ledger's count).

    Returns:
        ``held_at_start_bytes``; ``library_floor_bytes`` = held at start − the training's tensors
        (cuBLAS/cuDNN workspaces, and the allocator's rounding when the ledger's unrounded count is
        given; 0 when the training's tensors account for everything held); ``step_rise_bytes`` =
        peak − held at start (what the step itself allocated on top); ``peak_training_bytes`` =
        peak − floor (the training's peak: its tensors at the start plus the step's rise).
        The three parts add up: floor + peak_training = peak.

    Raises:
        ValueError: a negative figure, or a peak below what was held at the start (a peak not reset
            at the step's start); the message names the field.
    """
    for name, v in (("held_at_start_bytes", held_at_start_bytes), ("peak_bytes", peak_bytes),
                    ("training_at_start_bytes", training_at_start_bytes)):
        if v is None or v < 0:
            raise ValueError(f"{name} must be >= 0 (got {v!r})")
    if peak_bytes < held_at_start_bytes:
        raise ValueError(f"peak_bytes must be >= held_at_start_bytes ({peak_bytes} < {held_at_start_bytes}): "
                         "was the peak reset at the step's start?")
    floor = max(0, held_at_start_bytes - training_at_start_bytes)
    return dict(held_at_start_bytes=int(held_at_start_bytes), library_floor_bytes=int(floor),
                step_rise_bytes=int(peak_bytes - held_at_start_bytes),
                peak_training_bytes=int(peak_bytes - floor))
