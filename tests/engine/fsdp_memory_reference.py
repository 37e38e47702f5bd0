"""Independent reference for an FSDP rank's peak memory: PyTorch's own CPU allocator, not ddpviz's ledger.

Two gloo processes shard `build_model(cfg, ds)` with plain `fully_shard` (each hidden
layer, then the root: FSDP2's defaults), and train with `torch.optim.AdamW(lr)` on each rank's
`BatchPlan` shard with `F.cross_entropy`. Each step runs under `torch.profiler` with
`profile_memory=True`: c10's CPU allocator reports every allocation and free made on the training
thread (`ProfiledCPUMemoryReporter`, c10/core/CPUAllocator.cpp), the `[memory]` events of the
exported trace, each with its signed `Bytes`. A step's peak is the bytes alive at its start (the
local shards of the parameters, the optimizer state and buffers, by their storages) plus the
largest running sum of those events in time order. That counts the gathered parameters FSDP2
frees and re-allocates by resizing storage, and every temporary of backward and `opt.step`.
"""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist

# before any process group: imported later (DDP's constructor does, through torch._dynamo) its
# `group=group.WORLD` defaults pin the gloo group past destroy_process_group() into exit (SIGABRT)
import torch.distributed.nn.functional  # noqa: F401,E402
import torch.nn.functional as F

from ddpviz.engine.config import RunConfig
from ddpviz.engine.data import BatchPlan


def _alive_bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        st = local.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def _allocator_peak(trace_path: str) -> int:
    with open(trace_path, encoding="utf-8") as fh:
        events = [e for e in json.load(fh)["traceEvents"] if e.get("name") == "[memory]"]
    running = peak = 0
    for e in sorted(events, key=lambda e: e["ts"]):
        if e["args"].get("Device Type") == 0:  # CPU
            running += e["args"]["Bytes"]
            peak = max(peak, running)
    return peak


def _worker(rank, world, port, cfg_dict, tmp, out):
    from torch.distributed.fsdp import fully_shard
    from torch.profiler import ProfilerActivity, profile

    from ref_procs import gloo_model

    cfg, ds, model = gloo_model(rank, world, port, cfg_dict)
    for layer in model.hidden:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    plan = BatchPlan(len(ds), world, cfg.micro_batch_per_device, cfg.seed)
    peaks = []
    for step in range(cfg.steps):
        state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
        base = _alive_bytes([*model.parameters(), *model.buffers(), *state])
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            idx = plan.rank_indices(step, rank)
            F.cross_entropy(model(ds.x_train[idx]), ds.y_train[idx]).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        path = os.path.join(tmp, f"trace{rank}.json")
        prof.export_chrome_trace(path)
        peaks.append(base + _allocator_peak(path))
    out.put((rank, peaks))
    dist.barrier()


def allocator_peaks(cfg: RunConfig, tmp: str) -> dict[int, list[int]]:
    """rank -> each step's peak bytes (see module docstring); `cfg` must be an mlp on CPU."""
    from ref_procs import run_reference

    from ddpviz.engine.modes.launcher import free_port

    return dict(run_reference(_worker, (cfg.world_size, free_port(), cfg.to_json_dict(), tmp),
                              nprocs=cfg.world_size, results=cfg.world_size))
