"""The torch side of `ddpviz doctor --gpu`: probes of the CUDA paths that return plain figures.

Each function measures one thing on the GPUs at hand and returns a JSON-able dict; the verdicts
are the doctor's (workers/doctor/gpu.py). `memory_imbalance` reads events only and runs anywhere;
memory readings per second are counted where `ddpviz bench` counts them (workers/bench/measured.py).
"""

from __future__ import annotations

import json
import tempfile
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterable

import torch

MIB = 1 << 20


def nvml_uuid(index: int) -> str:
    """NVML's UUID (``GPU-...``) of CUDA device `index` (torch reports it with or without the prefix)."""
    uuid = str(torch.cuda.get_device_properties(index).uuid)
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


def cuda_inventory() -> dict[str, Any]:
    """torch, CUDA, NCCL versions and every visible CUDA device (name, memory, capability, UUID)."""
    devices = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        devices.append(dict(index=i, name=p.name, total_memory_bytes=p.total_memory,
                            capability=f"{p.major}.{p.minor}", uuid=nvml_uuid(i)))
    nccl = None
    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:
        pass
    return dict(torch=torch.__version__, cuda=torch.version.cuda, nccl=nccl,
                device_count=len(devices), devices=devices)


def nvml_vs_allocator(index: int = 0, probe_bytes: int = 256 * MIB) -> dict[str, Any]:
    """NVML's used memory of the GPU behind CUDA device `index` (found by UUID, not by index:
    CUDA's ordinal order is not NVML's) against this process's `torch.cuda.memory_reserved`.

    The difference is what the caching allocator does not see: the CUDA context, other
    processes, NCCL buffers. NVML's figure for this process alone (its compute-process entry) is
    given where the driver reports it.

    Raises:
        RuntimeError: NVML cannot be read (no library, no driver access).
    """
    import os

    block = torch.empty(probe_bytes, dtype=torch.uint8, device=f"cuda:{index}")  # make reserved > 0
    torch.cuda.synchronize(index)
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:
        raise RuntimeError(f"NVML unavailable: {exc}") from None
    try:
        uuid = nvml_uuid(index)
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        nvml_index = int(pynvml.nvmlDeviceGetIndex(handle))
        mine = None
        try:
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                    mine = int(proc.usedGpuMemory)
        except Exception:
            pass
        reserved = int(torch.cuda.memory_reserved(index))
        return dict(cuda_index=index, nvml_index=nvml_index, uuid=uuid, nvml_used_bytes=used,
                    torch_reserved_bytes=reserved, torch_allocated_bytes=int(torch.cuda.memory_allocated(index)),
                    difference_bytes=used - reserved, nvml_this_process_bytes=mine,
                    note="difference = CUDA context + other processes + memory outside the caching allocator")
    finally:
        del block
        pynvml.nvmlShutdown()


def memory_imbalance(events: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Peak memory per device (max over `memory` events of peak_allocated_bytes, else
    allocated_bytes) and max/min across devices."""
    peak: dict[str, int] = {}
    for e in events:
        if e.get("type") == "memory":
            v = e.get("peak_allocated_bytes") or e.get("allocated_bytes") or 0
            dev = str(e.get("device"))
            peak[dev] = max(peak.get(dev, 0), int(v))
    lo = min(peak.values(), default=0)
    return dict(peak_bytes=peak, max_over_min=(max(peak.values()) / lo) if lo else None)


class _Probe(torch.nn.Linear):
    """A Linear that records (thread name, output dtype)."""

    seen: list[tuple[str, torch.dtype]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        _Probe.seen.append((threading.current_thread().name, out.dtype))
        return out


def amp_in_replicas() -> dict[str, Any]:
    """The dtype a Linear produces inside DP replica threads under ddpviz's bf16 autocast:
    through ddpviz's runner and a full `CudaDP` step on every visible GPU, and (for contrast)
    through torch.nn.parallel.parallel_apply on two replicas sharing cuda:0 (two threads)."""
    from torch.nn.parallel import parallel_apply

    from ddpviz.engine.components.training import autocast, make_optimizer
    from ddpviz.engine.config import RunConfig
    from ddpviz.engine.modes.dp.book import SpanBook
    from ddpviz.engine.modes.dp.cuda import CudaDP
    from ddpviz.engine.modes.dp.hooks import CudaStreamClock, apply_in_threads

    n = torch.cuda.device_count()
    cfg = RunConfig(mode="dp", world_size=n, amp=True, global_batch_size=8 * n)
    torch.manual_seed(0)
    probe = _Probe(64, 10).cuda(0)
    x = torch.randn(8, 64, device="cuda:0")
    y = torch.randint(0, 10, (8 * n,), device="cuda:0")
    out: dict[str, Any] = {}
    with autocast(cfg, "cuda"):
        _Probe.seen = []
        clock = CudaStreamClock(cuda_index=[0, 0])
        clock.begin([0, 1])
        apply_in_threads([probe, probe], [x[:4], x[4:]], device_type="cuda", devices=[0, 0], micro=0,
                         book=SpanBook(), clock=clock, amp=lambda: autocast(cfg, "cuda"))
        out["ddpviz_runner_two_threads_on_cuda0"] = sorted({str(d) for _, d in _Probe.seen})
        _Probe.seen = []
        parallel_apply([probe, probe], [(x[:4],), (x[4:],)], devices=[0, 0])
        out["torch_parallel_apply_two_threads_on_cuda0"] = sorted({str(d) for _, d in _Probe.seen})
    _Probe.seen = []
    dp = CudaDP(cfg, torch.nn.Sequential(probe), n)
    dp.step(iter([(torch.randn(8 * n, 64, device="cuda:0"), y)]), make_optimizer(cfg, probe.parameters()))
    out["ddpviz_dp_step_on_%d_gpus" % n] = sorted({str(d) for _, d in _Probe.seen})
    out["asked"] = str(torch.bfloat16)
    return out


def _shared_setup(rank: int, world: int, init_file: str, cuda: bool) -> dict[str, Any]:
    """Process group, GPT, DDP with ddpviz's recording hook, optimizer and data plan of one rank."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddpviz.engine.components.training import make_optimizer
    from ddpviz.engine.config import RunConfig
    from ddpviz.engine.data import BatchPlan, load_dataset
    from ddpviz.engine.measure.clocks import CudaClock, HostClock
    from ddpviz.engine.models import build_model
    from ddpviz.engine.modes.ddp.comm_hook import BucketRecorder, recording_hook
    from ddpviz.engine.modes.ranks import join_process_group

    if cuda:
        torch.cuda.set_device(0)
    dev = torch.device("cuda:0" if cuda else "cpu")
    join_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    cfg = RunConfig(mode="ddp", model="gpt", dataset="text", width=128, depth=4, n_head=4, block_size=64,
                    world_size=world, global_batch_size=8 * world, bucket_cap_mb=0.25)
    ds = load_dataset(cfg)
    model = build_model(cfg, ds).to(dev)
    ddp = DDP(model, device_ids=[0] if cuda else None, bucket_cap_mb=cfg.bucket_cap_mb)
    rec = BucketRecorder(world, True, {p.data_ptr(): n for n, p in model.named_parameters()},
                         CudaClock() if cuda else HostClock())
    ddp.register_comm_hook(rec, recording_hook)
    return dict(dev=dev, ds=ds, model=model, ddp=ddp, rec=rec, opt=make_optimizer(cfg, ddp.parameters()),
                plan=BatchPlan(len(ds), world, cfg.micro_batch_per_device, cfg.seed))


def _shared_step(r: dict[str, Any], rank: int, step: int, cuda: bool) -> dict[str, Any]:
    """One step; its buckets (seconds from backward start) and this rank's memory."""
    from ddpviz.engine.components.training import loss_fn
    from ddpviz.engine.measure.memory import cuda_event

    idx = r["plan"].rank_indices(step, rank)
    loss = loss_fn(r["ddp"](r["ds"].x_train[idx].to(r["dev"])), r["ds"].y_train[idx].to(r["dev"]))
    r["rec"].begin_backward()
    loss.backward()
    r["opt"].step()
    r["opt"].zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize(0)
    # on CPU nothing here measures memory (a sum of parameter and gradient sizes would be a formula)
    memory = cuda_event(r["dev"]) if cuda else dict(allocated_bytes=None, reserved_bytes=None,
                                                    source="not measured: the harness reads the CUDA allocator")
    return dict(buckets=r["rec"].resolved(), memory=memory)


def _shared_rank(rank: int, world: int, init_file: str, out_dir: str, steps: int, device_kind: str) -> None:
    """One rank of `shared_gpu_ddp` (`start_rank_processes` target); writes `out_dir/rank<r>.json`."""
    import torch.distributed as dist

    from ddpviz.engine.measure.sync import param_checksum
    from ddpviz.engine.modes.ranks import leave_process_group

    cuda, stage = device_kind == "cuda", "init"
    result: dict[str, Any] = dict(rank=rank)
    try:
        r = _shared_setup(rank, world, init_file, cuda)
        stage = "steps"
        result["steps"] = [_shared_step(r, rank, step, cuda) for step in range(steps)]
        mine = torch.tensor(param_checksum(r["model"]), dtype=torch.float64)
        every = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)
        result["checksums"] = [t.tolist() for t in every]
        leave_process_group()
    except Exception as exc:
        result["error"] = dict(stage=stage, exception=f"{type(exc).__name__}: {exc}")
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result, default=str))


def shared_gpu_ddp(world: int = 2, steps: int = 4, device_kind: str = "cuda") -> dict[str, Any]:
    """`world` DDP ranks on the one cuda:0, gloo with CUDA tensors, ddpviz's recording comm hook
    (CUDA-event bucket times) and allocator memory per rank. Returns each rank's record:
    ``{rank, steps: [{buckets, memory}], checksums}`` or ``{rank, error: {stage, exception}}``
    (stage "init": torch refused the setup; "steps": it failed while training).

    ddpviz's own DDP path maps rank r to cuda:r (engine/modes/ddp/rank.py) and refuses world_size > GPUs
    (engine/components/devices.py), so this drives its comm hook and memory reader directly.
    `device_kind="cpu"` runs the same harness on CPU (host-clock buckets; memory not measured), for tests.
    """
    from ddpviz.engine.modes.ranks import start_rank_processes

    with tempfile.TemporaryDirectory(prefix="ddpviz-shared-gpu-") as tmp:
        try:
            start_rank_processes(_shared_rank, (world, f"{tmp}/pg", tmp, steps, device_kind), world)
        except Exception as exc:  # a rank died without writing its record
            return dict(ranks=[], error=f"{type(exc).__name__}: {exc}")
        ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]
    return dict(ranks=ranks)
