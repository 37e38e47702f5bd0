"""The NVIDIA driver against the CUDA torch was built for: read both, name a mismatch.

A CUDA build of torch runs only where the driver supports its CUDA major version: CUDA 13.x needs
a driver >= 580, CUDA 12.x >= 525 (NVIDIA's CUDA Toolkit release notes, table "CUDA Toolkit and
Corresponding Driver Versions"); within one major version an older driver runs a newer minor
version's build under minor-version compatibility (NVIDIA's "CUDA Compatibility" guide), a few
features aside. On a driver too old, `torch.cuda.is_available()` is simply False.

PyPI's torch for Linux x86_64 is a CUDA 13.0 build: torch 2.13.0's metadata requires
`nvidia-nccl-cu13` and `cuda-toolkit==13.0.3` (read with `pip install --dry-run --report` for
CPython 3.12, 2026-12-01); torch 2.10.0 is PyPI's last CUDA 12 build (issue 23's desk check of
PyPI's metadata). NVML (nvidia-ml-py, imported as `pynvml`) gives the driver's version
(`nvmlSystemGetDriverVersion`) and the newest CUDA it supports (`nvmlSystemGetCudaDriverVersion`,
an int: 1000 * major + 10 * minor, e.g. 12040 for 12.4).

`python -m ddpviz.workers.doctor.versions` prints both and the mismatch, if any (scripts/gpu_check.sh
runs it first); exit 0 when torch sees a CUDA device, else 3.
"""

from __future__ import annotations

import sys
from typing import Any

MIN_DRIVER_FOR_CUDA_MAJOR = {12: "525.60.13", 13: "580.65.06"}  # Linux, the release notes' table
PYPI_LAST_TORCH_FOR_CUDA_MAJOR = {12: "2.10.0"}  # PyPI's Linux x86_64 wheels; newer ones are CUDA 13
NO_CUDA_EXIT = 3


def cuda_version_text(version: int) -> str:
    """NVML's CUDA version int (1000 * major + 10 * minor) as "major.minor": 12040 -> "12.4"."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def _major_minor(text: str) -> tuple[int, int]:
    parts = (text.split(".") + ["0"])[:2]
    return int(parts[0]), int(parts[1])


def read_versions(nvml: Any = None, torch_mod: Any = None) -> dict[str, Any]:
    """{driver, driver_cuda, torch, torch_cuda, cuda_available, nvml_error}; every field that
    cannot be read is None (`nvml_error` says why NVML could not be read).

    Args:
        nvml: the `pynvml` module or a stand-in (tests); default: import pynvml.
        torch_mod: the `torch` module or a stand-in; default: import torch.
    """
    out: dict[str, Any] = dict(driver=None, driver_cuda=None, nvml_error=None)
    try:
        if nvml is None:
            import pynvml as nvml  # provided by nvidia-ml-py (never the deprecated `pynvml` package)
        nvml.nvmlInit()
        try:
            driver = nvml.nvmlSystemGetDriverVersion()
            out["driver"] = driver.decode() if isinstance(driver, bytes) else str(driver)
            out["driver_cuda"] = cuda_version_text(int(nvml.nvmlSystemGetCudaDriverVersion()))
        finally:
            nvml.nvmlShutdown()
    except Exception as exc:  # no library, no driver, no device access
        out["nvml_error"] = f"{type(exc).__name__}: {exc}"
    if torch_mod is None:
        import torch as torch_mod
    out.update(torch=str(torch_mod.__version__), torch_cuda=torch_mod.version.cuda,
               cuda_available=bool(torch_mod.cuda.is_available()))
    return out


def mismatch(v: dict[str, Any]) -> str | None:
    """Why this torch cannot use this driver, with the fix; None when they fit (or the driver
    is unknown and torch sees a device anyway)."""
    if v["torch_cuda"] is None:
        return (f"torch {v['torch']} is a CPU build (torch.version.cuda is None): install a CUDA build "
                f"(PyPI's torch for Linux x86_64 is CUDA 13.0; torch=={PYPI_LAST_TORCH_FOR_CUDA_MAJOR[12]} "
                f"for a CUDA 12 driver)")
    if v["driver_cuda"] is None:
        return None if v["cuda_available"] else (
            f"no NVIDIA driver found through NVML ({v['nvml_error']}); torch {v['torch']} needs one for "
            f"CUDA {v['torch_cuda']}")
    (tmaj, tmin), (dmaj, dmin) = _major_minor(v["torch_cuda"]), _major_minor(v["driver_cuda"])
    if tmaj > dmaj:
        need = MIN_DRIVER_FOR_CUDA_MAJOR.get(tmaj, "newer")
        fit = PYPI_LAST_TORCH_FOR_CUDA_MAJOR.get(dmaj)
        instead = f"torch=={fit} (PyPI's last CUDA {dmaj} build) or " if fit else ""
        return (f"driver/CUDA mismatch: torch {v['torch']} is built for CUDA {v['torch_cuda']}, which needs an "
                f"NVIDIA driver >= {need}; this driver {v['driver']} supports CUDA {v['driver_cuda']} at most. "
                f"Install {instead}a CUDA {dmaj}.x build of torch from your own index, or a driver >= {need}")
    if tmaj == dmaj and tmin > dmin:
        return None if v["cuda_available"] else (
            f"torch is built for CUDA {v['torch_cuda']}, this driver supports {v['driver_cuda']}: minor-version "
            f"compatibility should cover it, yet torch sees no device")
    return None


def describe(v: dict[str, Any]) -> str:
    """One line: the driver, the CUDA it supports, torch and its CUDA, whether torch sees a device."""
    driver = (f"driver {v['driver']} (CUDA {v['driver_cuda']} at most)" if v["driver"]
              else f"no NVIDIA driver via NVML ({v['nvml_error']})")
    return (f"{driver}; torch {v['torch']} built for CUDA {v['torch_cuda'] or 'none (CPU build)'}; "
            f"torch.cuda.is_available() {v['cuda_available']}")


def main() -> int:
    v = read_versions()
    print(f"versions: {describe(v)}", flush=True)
    why = mismatch(v)
    if why:
        print(f"versions: {why}", flush=True)
    return 0 if v["cuda_available"] else NO_CUDA_EXIT


if __name__ == "__main__":
    sys.exit(main())
