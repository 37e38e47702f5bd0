"""This host's GPUs through NVML (``nvidia-ml-py``, imported as ``pynvml``), without torch.

The worker's main process must never initialise CUDA (its forked work-horses use it), so GPUs are
listed and watched with NVML only. Without an NVIDIA driver every function here returns ``[]``.

NVML numbers GPUs in PCI bus order. A worker started with ``CUDA_VISIBLE_DEVICES`` sees only
those GPUs here: integer entries are read as NVML (PCI bus order) indices, ``GPU-...`` entries as
UUIDs (prefixes allowed, as CUDA does). Prefer UUIDs: CUDA's default order is fastest-first.
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger("ddpviz.worker")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def visible(gpus: list[dict[str, Any]], spec: str | None = None) -> list[dict[str, Any]]:
    """The entries of `gpus` (each with ``index`` and ``uuid``) that ``CUDA_VISIBLE_DEVICES``
    (`spec`, default the environment's) allows, in its order; all of them when it is unset."""
    spec = os.environ.get("CUDA_VISIBLE_DEVICES") if spec is None else spec
    if spec is None:
        return list(gpus)
    out = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            break  # CUDA stops at the first invalid entry
        match = [g for g in gpus if (item.isdigit() and g["index"] == int(item))
                 or (item.startswith("GPU-") and g["uuid"].startswith(item))]
        if len(match) != 1:
            break
        if match[0] not in out:
            out.append(match[0])
    return out


class GpuMonitor:
    """Keeps NVML initialised (in the thread that uses it) and reads every visible GPU.

    `inventory()` and `stats()` return ``[]`` when NVML is missing or fails; the first failure is
    logged once and NVML is not tried again.
    """

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: list[tuple[dict[str, Any], Any]] | None = None
        self._failed = False

    def _open(self) -> list[tuple[dict[str, Any], Any]]:
        if self._handles is not None or self._failed:
            return self._handles or []
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            found = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                found.append(({"index": i, "uuid": _text(pynvml.nvmlDeviceGetUUID(h)),
                               "name": _text(pynvml.nvmlDeviceGetName(h))}, h))
            keep = {g["index"] for g in visible([g for g, _ in found])}
            self._handles = [(g, h) for g, h in found if g["index"] in keep]
        except Exception as exc:  # no library, no driver, no GPU
            self._failed = True
            self._handles = []
            log.debug("NVML unavailable: %s", exc)
        return self._handles

    def inventory(self) -> list[dict[str, Any]]:
        """``[{index, uuid, name}]`` of the visible GPUs."""
        return [dict(g) for g, _ in self._open()]

    def stats(self) -> list[dict[str, Any]]:
        """``[{index, name, memory_used_bytes, memory_total_bytes, utilization_pct}]`` now
        (device-wide, all processes; utilization over NVML's last sample period, None if the GPU
        does not report it)."""
        out = []
        for gpu, h in self._open():
            try:
                mem = self._nvml.nvmlDeviceGetMemoryInfo(h)
                try:
                    util = float(self._nvml.nvmlDeviceGetUtilizationRates(h).gpu)
                except Exception:  # MIG instances and some boards do not report it
                    util = None
                out.append({"index": gpu["index"], "name": gpu["name"],
                            "memory_used_bytes": int(mem.used), "memory_total_bytes": int(mem.total),
                            "utilization_pct": util})
            except Exception as exc:  # a GPU fell off the bus: report the others
                log.warning("NVML: cannot read GPU %s: %s", gpu["index"], exc)
        return out

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
        self._nvml, self._handles = None, None
