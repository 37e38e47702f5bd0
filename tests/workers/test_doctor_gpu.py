"""`ddpviz doctor --gpu`'s verdicts, fed with hand-made probe results or CPU runs (no GPU here).

Each test gives a check the figures a probe could return and asserts the verdict it must reach;
the parity/memory pair runs the real `compare` flow on a small CPU config.
"""

import pytest

import ddpviz.engine.harness.gpu_checks as gpu_checks
import ddpviz.workers.doctor.gpu as doctor_gpu
from ddpviz.workers.doctor.report import CheckFailed, CheckSkipped


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
    for mode, events in state["parity_events"].items():  # what ran, from each run's own record
        assert next(e for e in events if e["type"] == "run_started")["config"]["optimizer"] == "sgd", mode
    assert "steps of sgd" in detail
    assert fig["modes"]["ddp"]["max_param_diff_vs_single"] <= doctor_gpu.PARITY_MAX_DIFF
    monkeypatch.setattr(doctor_gpu, "MEMORY_SAMPLES_PER_S_TARGET", 1e9)  # no run samples that fast
    with pytest.raises(CheckFailed, match="below the target") as exc:
        doctor_gpu.check_memory_rate(state)
    assert set(exc.value.figures["per_mode_device"]["dp"]["per_device"]) == {"cpu:0", "cpu:1"}


class FakeNvml:
    """pynvml's calls NvmlReader makes, for one GPU of UUID `uuid` with `used` bytes in use."""

    def __init__(self, uuid="GPU-5e1f", used=3 << 30):
        self.uuid, self.used = uuid, used

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid != self.uuid:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return "handle"

    def nvmlDeviceGetMemoryInfo(self, handle):
        return type("Mem", (), {"used": self.used})()


NVML_FIG = dict(cuda_index=0, uuid="GPU-5e1f", nvml_used_bytes=3 << 30, torch_reserved_bytes=2 << 30,
                difference_bytes=1 << 30)


def test_nvml_check_reads_through_ddpviz_own_reader(monkeypatch):
    import functools

    from ddpviz.engine.measure import memory

    monkeypatch.setattr(gpu_checks, "nvml_vs_allocator", lambda i: dict(NVML_FIG))
    real = memory.NvmlReader
    # the real reader, given NVML and CUDA's UUID of cuda:0 (no prefix, as torch prints it)
    monkeypatch.setattr(memory, "NvmlReader", functools.partial(real, nvml=FakeNvml(), uuid_of=lambda i: "5e1f"))
    detail, fig = doctor_gpu.check_nvml()
    assert fig["engine_nvml_used_bytes"] == 3 << 30 and "NVML 3072 MiB used" in detail
    # the reader finds no GPU of that UUID: memory events would say nothing; the check says so
    monkeypatch.setattr(memory, "NvmlReader", functools.partial(real, nvml=FakeNvml(), uuid_of=lambda i: "0ther"))
    with pytest.raises(CheckFailed, match="read nothing for cuda:0"):
        doctor_gpu.check_nvml()
    # the reader reads less than torch has reserved on that GPU: not the same GPU
    monkeypatch.setattr(memory, "NvmlReader", functools.partial(real, nvml=FakeNvml(used=1 << 30),
                                                                uuid_of=lambda i: "5e1f"))
    with pytest.raises(CheckFailed, match="engine_nvml_used_bytes.*wrong GPU"):
        doctor_gpu.check_nvml()


def test_nvml_check_fails_when_the_reader_is_gone(monkeypatch):
    from ddpviz.engine.measure import memory

    monkeypatch.setattr(gpu_checks, "nvml_vs_allocator", lambda i: dict(NVML_FIG))
    monkeypatch.delattr(memory, "NvmlReader")
    with pytest.raises(CheckFailed, match="NvmlReader is missing"):
        doctor_gpu.check_nvml()


def test_memory_rate_counts_the_readings_that_reached_the_stream():
    """Two steps of 0.5 s; the timer's `memory_readings` events list 24 readings of cuda:0 taken in
    that 1.0 s (and 5 before it, not counted) = 24/s; a `memory` event's own count of readings
    (`sampler.readings`, which need not have reached the stream) is not counted."""
    events = [dict(type="step", device="cuda:0", start_ts=100.0 + 0.5 * i, step_time_s=0.5) for i in range(2)]
    inside = [100.0 + i / 24 for i in range(24)]
    events += [dict(type="memory_readings", device="cuda:0", reading_ts=[99.0] * 5 + inside[:12]),
               dict(type="memory_readings", device="cuda:0", reading_ts=inside[12:])]
    events += [dict(type="memory", device="cuda:0", ts=100.5, sampler=dict(readings=500))]
    detail, fig = doctor_gpu.check_memory_rate({"parity_events": {"single": events}})
    assert fig["lowest_per_s"] == pytest.approx(24.0) and "at least 24.0" in detail
    thin = [dict(e, reading_ts=e["reading_ts"][-1:]) if e["type"] == "memory_readings" else e
            for e in events]  # 2 readings in 1 s
    with pytest.raises(CheckFailed, match="lowest rate 2.0 samples/s"):
        doctor_gpu.check_memory_rate({"parity_events": {"single": thin}})
