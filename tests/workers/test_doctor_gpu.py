"""`ddpviz doctor --gpu`'s verdicts, fed with hand-made probe results or CPU runs (no GPU here).

Each test gives a check the figures a probe could return and asserts the verdict it must reach;
the parity/memory pair runs the real `compare` flow on a small CPU config.
"""

import pytest

import engine.harness.gpu_checks as gpu_checks
import workers.doctor.gpu as doctor_gpu
from workers.doctor.report import CheckFailed, CheckSkipped


def rank(r, buckets, allocated=1000, checksums=((1.0, 2.0), (1.0, 2.0))):
    return dict(rank=r, steps=[dict(buckets=buckets, memory=dict(allocated_bytes=allocated, reserved_bytes=allocated))],
                checksums=[list(c) for c in checksums])


GOOD = [dict(ready_s=0.001, comm_start_s=0.001, comm_end_s=0.004), dict(ready_s=0.003, comm_start_s=0.004, comm_end_s=0.006)]


def test_shared_gpu_passes_on_ordered_cuda_timed_buckets(monkeypatch):
    monkeypatch.setattr(gpu_checks, "shared_gpu_ddp", lambda **kw: dict(ranks=[rank(0, GOOD), rank(1, GOOD)]))
    detail, fig = doctor_gpu.check_shared_gpu()
    assert "2 CUDA-timed buckets per step, in sync" in detail
    assert [s["buckets_last_step"] for s in fig["summary"]] == [2, 2]


def test_shared_gpu_fails_on_disordered_buckets_or_drifted_replicas(monkeypatch):
    late = [dict(ready_s=0.005, comm_start_s=0.004, comm_end_s=0.006)] + GOOD  # started before it was ready
    monkeypatch.setattr(gpu_checks, "shared_gpu_ddp", lambda **kw: dict(ranks=[rank(0, late), rank(1, GOOD)]))
    with pytest.raises(CheckFailed, match="out of order"):
        doctor_gpu.check_shared_gpu()
    drift = ((1.0, 2.0), (1.5, 2.0))
    monkeypatch.setattr(gpu_checks, "shared_gpu_ddp",
                        lambda **kw: dict(ranks=[rank(0, GOOD, checksums=drift), rank(1, GOOD, checksums=drift)]))
    with pytest.raises(CheckFailed, match="out of sync"):
        doctor_gpu.check_shared_gpu()


def test_shared_gpu_is_skipped_when_torch_refuses_the_setup(monkeypatch):
    err = dict(stage="init", exception="RuntimeError: gloo does not support CUDA here")
    monkeypatch.setattr(gpu_checks, "shared_gpu_ddp", lambda **kw: dict(ranks=[dict(rank=0, error=err)] * 2))
    with pytest.raises(CheckSkipped, match="torch does not allow 2 gloo ranks .* gloo does not support CUDA"):
        doctor_gpu.check_shared_gpu()


def test_amp_check_fails_when_a_replica_runs_fp16(monkeypatch):
    fig = {"ddpviz_runner_two_threads_on_cuda0": ["torch.bfloat16"], "ddpviz_dp_step_on_1_gpus": ["torch.float16"],
           "torch_parallel_apply_two_threads_on_cuda0": ["torch.float16"], "asked": "torch.bfloat16"}
    monkeypatch.setattr(gpu_checks, "amp_in_replicas", lambda: fig)
    with pytest.raises(CheckFailed, match="ddpviz_dp_step_on_1_gpus"):
        doctor_gpu.check_amp()
    fig["ddpviz_dp_step_on_1_gpus"] = ["torch.bfloat16"]
    detail, _ = doctor_gpu.check_amp()
    assert "torch's parallel_apply threads ran ['torch.float16']" in detail


def test_the_gpu_tests_are_found():
    assert "tests/engine/test_gpu.py" in [str(p.relative_to(doctor_gpu.ROOT)) for p in doctor_gpu.gpu_test_files()]


@pytest.mark.slow
def test_parity_and_memory_rate_flow_on_a_cpu_config(monkeypatch):
    monkeypatch.setattr(doctor_gpu, "PARITY", dict(world_size=2, steps=4, global_batch_size=32, device="cpu",
                                                   eval_every=0, step_delay_s=0.0))
    state = {}
    detail, fig = doctor_gpu.check_parity(state)
    assert "max |Δθ| vs single" in detail and set(fig["modes"]) == {"single", "dp", "ddp"}
    assert fig["modes"]["ddp"]["max_param_diff_vs_single"] <= doctor_gpu.PARITY_MAX_DIFF
    monkeypatch.setattr(doctor_gpu, "MEMORY_SAMPLES_PER_S_TARGET", 1e9)  # no run samples that fast
    with pytest.raises(CheckFailed, match="below the target") as exc:
        doctor_gpu.check_memory_rate(state)
    assert set(exc.value.figures["per_mode_device"]["dp"]) == {"cpu:0", "cpu:1"}
