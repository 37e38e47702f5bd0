"""Memory per device: accounted tensor bytes on CPU, torch.cuda and NVML on GPU.

On CPU there is no per-device allocator, so ddpviz counts the bytes of the tensors each (virtual)
device holds — parameters, gradients, optimizer state, activations saved for backward, inputs,
gathered outputs — and reports them with ``source="accounted"``. On GPU it reports
``torch.cuda.memory_allocated/reserved`` (PyTorch caching allocator) and NVML's device-wide used
memory (``nvidia-ml-py``, imported as ``pynvml``).
"""

from __future__ import annotations

import threading
from typing import Any, Iterable

import torch
import torch.nn as nn


def tensor_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Sum of numel * element_size over the tensors (None skipped)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def param_bytes(model: nn.Module) -> int:
    return tensor_bytes(model.parameters())


def grads_bytes(model: nn.Module) -> int:
    return tensor_bytes(p.grad for p in model.parameters())


def buffer_bytes(model: nn.Module) -> int:
    return tensor_bytes(model.buffers())


def optimizer_state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes of tensors in the optimizer state (AdamW: exp_avg + exp_avg_sq = 2 P; SGD: 0)."""
    return sum(tensor_bytes(v for v in st.values() if torch.is_tensor(v)) for st in opt.state.values())


class ActivationCounter:
    """Counts bytes autograd saves for backward while active (`torch.autograd.graph.saved_tensors_hooks`).

    Parameters (leaf tensors requiring grad) are not activations and are skipped; a storage saved
    twice counts once. The hooks are thread-local, so each DP device thread counts its own.
    """

    def __init__(self) -> None:
        self.nbytes = 0
        self._seen: set[tuple[int, int]] = set()

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if not (t.is_leaf and t.requires_grad):
            key = (t.untyped_storage().data_ptr(), t.numel())
            if key not in self._seen:
                self._seen.add(key)
                self.nbytes += t.numel() * t.element_size()
        return t

    def __enter__(self) -> "ActivationCounter":
        self.nbytes, self._seen = 0, set()
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._ctx.__exit__(*exc)


def accounted_event(breakdown: dict[str, int]) -> dict[str, Any]:
    """Fields of a `memory` event for a CPU (virtual) device from its byte breakdown."""
    total = int(sum(breakdown.values()))
    return dict(allocated_bytes=total, reserved_bytes=total, used_bytes=None, source="accounted",
                breakdown={k: int(v) for k, v in breakdown.items()}, peak_allocated_bytes=total)


_nvml_lock = threading.Lock()
_nvml_ready: bool | None = None


def nvml_used_bytes(index: int) -> tuple[int | None, int | None]:
    """(device-wide used memory bytes, GPU utilisation %) from NVML, or (None, None) without it."""
    global _nvml_ready
    try:
        import pynvml  # provided by the nvidia-ml-py distribution

        with _nvml_lock:
            if _nvml_ready is None:
                pynvml.nvmlInit()
                _nvml_ready = True
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        util = pynvml.nvmlDeviceGetUtilizationRates(handle)
        return int(mem.used), int(util.gpu)
    except Exception:
        _nvml_ready = False if _nvml_ready is None else _nvml_ready
        return None, None


def cuda_event(device: torch.device, breakdown: dict[str, int] | None = None) -> dict[str, Any]:
    """Fields of a `memory` event for a CUDA device (allocator + NVML)."""
    idx = device.index or 0
    used, util = nvml_used_bytes(idx)
    return dict(allocated_bytes=int(torch.cuda.memory_allocated(idx)),
                reserved_bytes=int(torch.cuda.memory_reserved(idx)),
                peak_allocated_bytes=int(torch.cuda.max_memory_allocated(idx)),
                used_bytes=used, utilization_pct=util, source="nvml" if used is not None else "torch",
                breakdown={k: int(v) for k, v in (breakdown or {}).items()})
