"""CUDA paths: torch.nn.parallel DP with CUDA-event timing, DDP on NCCL, NVML memory.

Marked `gpu`; skipped where torch.cuda.is_available() is False (CI and laptops). On a CUDA host:
`.venv/bin/python -m pytest -m gpu tests/engine/test_gpu.py`.
"""

import pytest
import torch

from engine.config import RunConfig
from engine.events import ListSink
from engine.run import run_training

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (torch.cuda.is_available() is False)")]
N = max(1, min(2, torch.cuda.device_count())) if torch.cuda.is_available() else 1
SMALL = dict(world_size=N, device="cuda", width=64, depth=2, global_batch_size=32, steps=4, lr=0.1,
             eval_every=2, step_delay_s=0)


def run(**fields):
    sink = ListSink()
    result = run_training(RunConfig(**fields), sink, "gpu")
    assert result.status == "succeeded", result.error
    return result, sink


def test_dp_on_cuda_matches_single_and_times_every_phase():
    dp, sink = run(mode="dp", **SMALL)
    single, _ = run(mode="single", **SMALL)
    # cuBLAS may pick different kernels for the split batch: allow a little more than on CPU
    torch.testing.assert_close(dp.final_params, single.final_params, rtol=1e-4, atol=1e-5)
    phases = {e["phase"] for e in sink.of_type("dp_phase")}
    assert {"broadcast", "scatter", "forward", "gather", "loss", "backward", "optimizer"} <= phases
    assert all(e["end_s"] >= e["start_s"] >= 0 for e in sink.of_type("dp_phase"))
    started = sink.of_type("run_started")[0]
    assert started["emulated"] is False and started["devices"][0]["kind"] == "cuda"


def test_ddp_on_nccl_matches_single_with_cuda_timed_buckets():
    ddp, sink = run(mode="ddp", bucket_cap_mb=0.01, **SMALL)
    single, _ = run(mode="single", **SMALL)
    torch.testing.assert_close(ddp.final_params, single.final_params, rtol=1e-4, atol=1e-5)
    assert sink.of_type("run_started")[0]["backend"] == "nccl"
    for b in sink.of_type("bucket"):
        assert 0 <= b["ready_s"] <= b["comm_start_s"] <= b["comm_end_s"]


def test_memory_comes_from_the_allocator_and_nvml():
    _, sink = run(mode="single", **SMALL)
    mem = sink.of_type("memory")
    assert mem and all(e["source"] == "cuda" and "cuda" in e["curve"] for e in mem)
    for e in mem:
        assert e["peak_allocated_bytes"] >= e["allocated_bytes"] > 0
        assert e["reserved_bytes"] >= e["allocated_bytes"]
        # the ledger counts storages' bytes; the allocator rounds each block up (512 B and more)
        assert 0 < e["tensors_peak_bytes"] <= e["peak_allocated_bytes"]
    if mem[0]["used_bytes"] is not None:  # NVML, same GPU by UUID: includes the CUDA context
        assert mem[0]["used_bytes"] >= mem[0]["reserved_bytes"]
