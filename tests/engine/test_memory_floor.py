"""A CUDA step's peak split into the library's floor and the training's own (issue 31, point 4).

On an H200 the DP per-step peak was 137,560,064 B for a ~36 KB model: four 32 MiB cuBLAS
workspaces (one per handle and stream, kept by the caching allocator) plus 3.2 MiB. These tests
build the readings such a step gives (no GPU needed) and check the split against hand-worked
figures; `tests/engine/test_gpu.py` checks the same fields on a real GPU.
"""

import pytest
import torch

from ddpviz.engine.measure.memory import ALLOCATOR_BLOCK_BYTES, allocator_rounded_bytes, step_memory_parts
from ddpviz.engine.summary import SummaryBuilder

MIB = 1024 * 1024
CUBLAS_WORKSPACE = 32 * MIB  # per handle and stream on Hopper (torch 2.11)
MODEL = 36 * 1024  # the ~36 KB model's parameters, gradients and optimizer state, allocator-rounded


def test_h200_reading_splits_into_four_workspaces_and_the_training():
    held = 4 * CUBLAS_WORKSPACE + MODEL  # held when the step began: workspaces + the model's tensors
    parts = step_memory_parts(held, 137_560_064, MODEL)
    assert parts["library_floor_bytes"] == 4 * CUBLAS_WORKSPACE == 134_217_728
    assert parts["peak_training_bytes"] == 137_560_064 - 134_217_728 == 3_342_336  # the "3.2 MiB"
    assert parts["step_rise_bytes"] == 137_560_064 - held
    assert parts["library_floor_bytes"] + parts["peak_training_bytes"] == 137_560_064


def test_a_device_holding_no_training_tensor_is_all_floor_between_steps():
    # DP's devices 1..n-1: replicas are rebuilt each step, so what they hold at the start is a library's
    parts = step_memory_parts(2 * CUBLAS_WORKSPACE, 2 * CUBLAS_WORKSPACE + 5_000_000, 0)
    assert parts == dict(held_at_start_bytes=2 * CUBLAS_WORKSPACE, library_floor_bytes=2 * CUBLAS_WORKSPACE,
                         step_rise_bytes=5_000_000, peak_training_bytes=5_000_000)


def test_no_floor_when_the_training_accounts_for_everything_held():
    parts = step_memory_parts(10_240, 50_000, 10_240)
    assert parts["library_floor_bytes"] == 0 and parts["peak_training_bytes"] == 50_000


@pytest.mark.parametrize("args, field", [((100, 50, 0), "peak_bytes must be >= held_at_start_bytes"),
                                         ((-1, 50, 0), "held_at_start_bytes must be >= 0"),
                                         ((0, 50, -3), "training_at_start_bytes must be >= 0")])
def test_bad_readings_are_refused_naming_the_field(args, field):
    with pytest.raises(ValueError, match=field):
        step_memory_parts(*args)


def test_allocator_rounding_by_hand():
    a = torch.zeros(10)  # 40 B -> one 512 B block
    b = torch.zeros(200)  # 800 B -> two blocks
    assert ALLOCATOR_BLOCK_BYTES == 512
    assert allocator_rounded_bytes([a, b, None]) == 512 + 1024
    assert allocator_rounded_bytes([b, b[:10], b.view(20, 10)]) == 1024  # one storage, counted once


def _memory(device: str, peak: int, floor: int) -> dict:
    return dict(type="memory", step=3, device=device, source="cuda", peak_allocated_bytes=peak,
                allocated_bytes=peak // 2, library_floor_bytes=floor, peak_training_bytes=peak - floor)


def test_summary_imbalance_describes_the_training_not_the_workspaces():
    # DP on 2 GPUs: device 0 holds the model, gathered outputs and reduced gradients; device 1 a
    # replica's activations. Both carry cuBLAS workspaces (4 on device 0, 2 on device 1).
    b = SummaryBuilder()
    b.observe(_memory("cuda:0", 4 * CUBLAS_WORKSPACE + 3_000_000, 4 * CUBLAS_WORKSPACE))
    b.observe(_memory("cuda:1", 2 * CUBLAS_WORKSPACE + 1_000_000, 2 * CUBLAS_WORKSPACE))
    s = b.summary()
    assert s["peak_training_bytes"] == {"cuda:0": 3_000_000, "cuda:1": 1_000_000}
    assert s["library_floor_bytes"] == {"cuda:0": 4 * CUBLAS_WORKSPACE, "cuda:1": 2 * CUBLAS_WORKSPACE}
    assert s["memory_imbalance"] == pytest.approx(3.0)  # not 137.2 / 68.1 = 2.01x, the workspaces' ratio
    assert s["peak_memory_bytes"]["cuda:0"] == 4 * CUBLAS_WORKSPACE + 3_000_000  # the allocator's, kept


def test_summary_without_a_floor_keeps_the_allocator_peaks():
    b = SummaryBuilder()
    for dev, peak in (("cpu:0", 4000), ("cpu:1", 1000)):
        b.observe(dict(type="memory", step=0, device=dev, source="tensors", peak_allocated_bytes=peak))
    s = b.summary()
    assert s["memory_imbalance"] == pytest.approx(4.0) and "peak_training_bytes" not in s


def test_summary_reads_the_training_peak_after_step_0_which_makes_the_workspaces():
    b = SummaryBuilder()
    # step 0: nothing held at its start, its first matmuls allocate the workspaces inside it
    b.observe(dict(_memory("cuda:0", 4 * CUBLAS_WORKSPACE + 3_000_000, 0), step=0))
    b.observe(dict(_memory("cuda:0", 4 * CUBLAS_WORKSPACE + 2_500_000, 4 * CUBLAS_WORKSPACE), step=1))
    s = b.summary()
    assert s["peak_training_bytes"] == {"cuda:0": 2_500_000}  # not step 0's 134 MB rise
    assert s["library_floor_bytes"] == {"cuda:0": 4 * CUBLAS_WORKSPACE}
