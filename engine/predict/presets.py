"""Link and compute presets for the scale-out predictor, each number with its basis and source.

Pure Python (no torch). A link is the alpha-beta (Hockney) pair of the ring all-reduce model
t(b) = 2(n-1)·alpha + 2(n-1)/n · b/beta (Thakur et al. 2005; Patarasuk & Yuan 2009): `alpha_s`
is the latency of one ring step, `beta_bytes_per_s` the bandwidth one device sends at (per
direction), the same quantity nccl-tests reports as busbw (nccl-tests doc/PERFORMANCE.md). Where a
published nccl-tests busbw exists, beta is that achieved figure; otherwise it is the line rate, an
upper bound, and says so. Latencies are rough: small-message all-reduce times from published
nccl-tests output divided by the 2(n-1) ring steps.

A compute preset is a GPU's peak throughput from its datasheet and an assumed utilisation; the
predictor divides the work of a step by peak x utilisation. The table with every source is in
docs/predict.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

GB = 1e9  # decimal gigabyte, as datasheets and nccl-tests use
US = 1e-6


@dataclass(frozen=True)
class LinkPreset:
    """One link's alpha-beta pair.

    Attributes:
        key: the name on the command line (`--link`).
        label: what the page shows.
        alpha_s: latency of one ring step (s).
        beta_bytes_per_s: per-device, per-direction bandwidth (bytes/s), comparable to busbw.
        between_hosts: True for a network between hosts, False for a link inside one host.
        beta_basis / alpha_basis: how the number was arrived at (achieved, line rate, assumed).
        source: where the numbers come from (URLs).
    """

    key: str
    label: str
    alpha_s: float
    beta_bytes_per_s: float
    between_hosts: bool
    beta_basis: str
    alpha_basis: str
    source: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_INTRA_ALPHA = 0.6 * US
_INTRA_ALPHA_BASIS = ("rough: an 8-GPU NCCL all-reduce of 8 bytes takes ~8.4 us "
                      "(tinygrad/open-gpu-kernel-modules#45), / 2(8-1) = 14 ring steps")
_ETH_ALPHA = 30 * US
_ETH_ALPHA_BASIS = ("rough: NCCL over TCP sockets between hosts; ~130 us for an 8-byte "
                    "all-reduce over 100 GbE (NVIDIA/nccl#1184) spread over a few ring steps")

LINKS: dict[str, LinkPreset] = {p.key: p for p in (
    LinkPreset("pcie4", "PCIe 4.0 x16", _INTRA_ALPHA, 31.5 * GB, False,
               "line rate per direction (16 GT/s x 16 lanes, 128b/130b): an upper bound",
               _INTRA_ALPHA_BASIS,
               "PCI-SIG PCIe 4.0 base specification; NVIDIA A100 datasheet 'PCIe Gen4: 64 GB/s' "
               "(both directions) https://www.nvidia.com/en-us/data-center/a100/"),
    LinkPreset("pcie5", "PCIe 5.0 x16", _INTRA_ALPHA, 63.0 * GB, False,
               "line rate per direction (32 GT/s x 16 lanes, 128b/130b): an upper bound",
               _INTRA_ALPHA_BASIS,
               "PCI-SIG PCIe 5.0 base specification; NVIDIA H100 datasheet 'PCIe Gen5: 128 GB/s' "
               "(both directions) https://www.nvidia.com/en-us/data-center/h100/"),
    LinkPreset("nvlink-a100", "NVLink 3 (A100 SXM, NVSwitch)", _INTRA_ALPHA, 200 * GB, False,
               "achieved: nccl-tests all_reduce busbw ~200-208 GB/s on 8x A100 SXM4 "
               "(line rate 300 GB/s per direction, 600 GB/s both)",
               _INTRA_ALPHA_BASIS,
               "https://github.com/NVIDIA/nccl-tests/issues/149 ; "
               "https://github.com/NVIDIA/nccl-tests/issues/178 ; "
               "https://www.nvidia.com/en-us/data-center/a100/"),
    LinkPreset("nvlink-h100", "NVLink 4 (H100 SXM, NVSwitch)", _INTRA_ALPHA, 370 * GB, False,
               "achieved: NCCL ring all-reduce busbw ~370 GB/s on 2-8 H100 SXM (line rate "
               "450 GB/s per direction, 900 GB/s both; ~20% protocol overhead, NCCL maintainer)",
               _INTRA_ALPHA_BASIS,
               "https://github.com/NVIDIA/nccl-tests/issues/212 ; "
               "https://github.com/NVIDIA/nccl/issues/1455 ; "
               "https://www.nvidia.com/en-us/data-center/h100/"),
    LinkPreset("nvlink-h200", "NVLink 4 (H200 SXM, NVSwitch)", _INTRA_ALPHA, 370 * GB, False,
               "same NVLink 4 as H100 (900 GB/s both directions); ring busbw as H100; NVLink "
               "SHARP reaches 475 GB/s busbw on 8x H200 (not modelled)",
               _INTRA_ALPHA_BASIS,
               "https://www.nvidia.com/en-us/data-center/h200/ ; "
               "https://github.com/NVIDIA/nccl-tests/issues/272"),
    LinkPreset("eth25", "25 GbE between hosts", _ETH_ALPHA, 3.125 * GB, True,
               "line rate (25 Gb/s): an upper bound; TCP sockets reach less", _ETH_ALPHA_BASIS,
               "IEEE 802.3by (25GBASE-R)"),
    LinkPreset("eth100", "100 GbE between hosts", _ETH_ALPHA, 12.5 * GB, True,
               "line rate (100 Gb/s): an upper bound; TCP sockets reach less", _ETH_ALPHA_BASIS,
               "IEEE 802.3ba (100GBASE-R) ; https://github.com/NVIDIA/nccl/issues/1184"),
    LinkPreset("eth400", "400 GbE between hosts", _ETH_ALPHA, 50.0 * GB, True,
               "line rate (400 Gb/s): an upper bound; TCP sockets reach less", _ETH_ALPHA_BASIS,
               "IEEE 802.3bs (400GBASE-R)"),
    LinkPreset("ib400", "InfiniBand NDR 400 Gb/s between hosts", 1.5 * US, 48.0 * GB, True,
               "96% of the 50 GB/s line rate: 4x HDR 200 Gb/s NICs reach 96 of 100 GB/s busbw "
               "in nccl-tests (NVIDIA/nccl-tests#119)",
               "rough: 16 GPUs on 2 hosts over NDR, ~46 us for a small all-reduce "
               "(NVIDIA/nccl#1244) / 2(16-1) = 30 ring steps",
               "https://github.com/NVIDIA/nccl-tests/issues/119 ; "
               "https://github.com/NVIDIA/nccl/issues/1244 ; "
               "https://www.nvidia.com/en-us/networking/infiniband-adapters/"),
)}
THIS_MACHINE = "this-machine"  # alpha/beta fitted to the run's own probe or buckets


@dataclass(frozen=True)
class ComputePreset:
    """A GPU's datasheet peaks.

    Attributes:
        fp32_flops: dense FP32 peak (FLOP/s): what an fp32 run's matmuls use (PyTorch keeps
            `torch.backends.cuda.matmul.allow_tf32` False by default).
        bf16_flops: dense BF16 tensor-core peak (FLOP/s), for runs with `amp`.
        hbm_bytes_per_s: memory bandwidth (bytes/s), for the optimizer step, which streams
            parameters, gradients and optimizer state and does little arithmetic.
    """

    key: str
    label: str
    fp32_flops: float
    bf16_flops: float
    hbm_bytes_per_s: float
    source: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


TFLOPS = 1e12
COMPUTES: dict[str, ComputePreset] = {p.key: p for p in (
    ComputePreset("a100", "A100 SXM 80GB", 19.5 * TFLOPS, 312 * TFLOPS, 2039 * GB,
                  "NVIDIA A100 datasheet: FP32 19.5 TFLOPS, BF16 312 TFLOPS (dense), HBM2e "
                  "2,039 GB/s https://www.nvidia.com/en-us/data-center/a100/"),
    ComputePreset("h100", "H100 SXM", 67 * TFLOPS, 989 * TFLOPS, 3350 * GB,
                  "NVIDIA H100 datasheet: FP32 67 TFLOPS, BF16 1,979 TFLOPS with sparsity = "
                  "989 dense, HBM3 3.35 TB/s https://www.nvidia.com/en-us/data-center/h100/"),
    ComputePreset("h200", "H200 SXM", 67 * TFLOPS, 989 * TFLOPS, 4800 * GB,
                  "NVIDIA H200 datasheet: FP32 67 TFLOPS, BF16 1,979 TFLOPS with sparsity = "
                  "989 dense, HBM3e 4.8 TB/s https://www.nvidia.com/en-us/data-center/h200/"),
)}
AS_MEASURED = "as-measured"
DEFAULT_UTILISATION = 0.4  # assumed share of peak a training step reaches; the page lets you change it


def link(key: str) -> LinkPreset:
    """The preset named `key`.

    Raises:
        ValueError: no such preset (the message lists the known keys).
    """
    return _named(LINKS, "link", key, THIS_MACHINE)


def custom_link(alpha_s: float, beta_bytes_per_s: float, between_hosts: bool = False) -> LinkPreset:
    """A link a person typed in.

    Raises:
        ValueError: alpha_s < 0 or beta_bytes_per_s <= 0 (naming the field).
    """
    if not alpha_s >= 0:
        raise ValueError(f"alpha_s must be >= 0 seconds (got {alpha_s})")
    if not beta_bytes_per_s > 0:
        raise ValueError(f"beta_bytes_per_s must be > 0 (got {beta_bytes_per_s})")
    return LinkPreset("custom", "typed in", alpha_s, beta_bytes_per_s, between_hosts,
                      "typed in", "typed in", "typed in by the user")


def compute(key: str) -> ComputePreset:
    """The preset named `key`.

    Raises:
        ValueError: no such preset (the message lists the known keys).
    """
    return _named(COMPUTES, "compute", key, AS_MEASURED)


def _named(table: dict, field: str, key: str, measured_key: str):
    """`table[key]`, or a ValueError naming `field` and every key it accepts (the measured one first)."""
    if key not in table:
        raise ValueError(f"{field} must be one of {', '.join([measured_key, *table])} (got {key!r})")
    return table[key]
