"""A model too large for the host is refused before it is built (a new user, 2026-12-06: a 3.2 B-parameter MLP
was accepted on a 24 GiB host and its ranks were built until the kernel killed them).

References: the parameter counts of hand-worked layer shapes and of the real model (built on the CPU), and
hand arithmetic for the bytes (4 B a fp32 number; AdamW keeps two moments per parameter).
"""

from __future__ import annotations

import pytest

from ddpviz.engine.components.devices import DevicePlan, PreflightError
from ddpviz.engine.components.preflight import check_model_fits, model_state_bytes
from ddpviz.engine.config import RunConfig, validate_config
from ddpviz.engine.data import load_dataset
from ddpviz.engine.events import ListSink
from ddpviz.engine.models import build_model, builtin_param_count, param_count
from ddpviz.engine.run import run_training

GIB = 1024 ** 3


def test_the_count_from_the_shapes_is_the_built_models_and_a_hand_worked_mlps():
    cfg = RunConfig(mode="single", model="mlp", width=32, depth=3)
    ds = load_dataset(cfg)
    # Linear(in, 32) + 2 x Linear(32, 32) + Linear(32, classes), each with its bias
    by_hand = (ds.in_dim * 32 + 32) + 2 * (32 * 32 + 32) + (32 * ds.n_classes + ds.n_classes)
    assert builtin_param_count(cfg, ds) == by_hand
    for kw in (dict(model="cnn", width=8, depth=2), dict(model="gpt", dataset="text", width=32, depth=2, n_head=4)):
        cfg = RunConfig(mode="single", **kw)
        ds = load_dataset(cfg)
        assert builtin_param_count(cfg, ds) == param_count(build_model(cfg, ds)), kw
    assert builtin_param_count(cfg.model_copy(update={"model": "a_plugin"}), ds) is None  # its build may do anything


@pytest.mark.parametrize("mode, optimizer, world_size, device, host", [
    ("single", "adamw", 1, 16_000, 16_000),  # weights + gradients + 2 moments, 4 B each, 1,000 parameters
    ("single", "sgd", 1, 8_000, 8_000),  # no momentum: weights + gradients
    ("ddp", "adamw", 2, 16_000, 32_000),  # each rank all of it
    ("dp", "adamw", 4, 16_000, 16_000 + 3 * 8_000),  # device 0 all of it, 3 replicas' weights and gradients
    ("fsdp", "adamw", 2, 8_000, 16_000),  # each rank half of all of it
])
def test_the_bytes_each_device_and_the_host_hold_at_least(mode, optimizer, world_size, device, host):
    cfg = RunConfig(mode=mode, optimizer=optimizer, world_size=world_size)
    assert model_state_bytes(cfg, 1_000, 1 if mode == "single" else world_size) == (device, host)


def test_the_host_is_weighed_on_cpu_and_each_gpu_on_cuda():
    cfg = RunConfig(mode="ddp", world_size=2)  # 100 M parameters: 1.6 GB a rank, 3.2 GB the host
    cpu = DevicePlan("cpu", ["cpu:0", "cpu:1"], "gloo", False)
    check_model_fits(cfg, cpu, 100_000_000, {"host": 4 * GIB})
    with pytest.raises(PreflightError) as refused:
        check_model_fits(cfg, cpu, 100_000_000, {"host": 2 * GIB})
    assert refused.value.field == "width"
    assert "100.0 M parameters: ddp needs at least 3.0 GiB on this host (2 devices)" in str(refused.value)
    assert "more than the 2.0 GiB this host has available" in str(refused.value)
    cuda = DevicePlan("cuda", ["cuda:0", "cuda:1"], "nccl", False)
    check_model_fits(cfg, cuda, 100_000_000, {"host": 1 * GIB, "cuda:0": 2 * GIB, "cuda:1": 2 * GIB})
    with pytest.raises(PreflightError, match="1.5 GiB on cuda:0 .* more than the 1.0 GiB cuda:0 has in all"):
        check_model_fits(cfg, cuda, 100_000_000, {"host": 64 * GIB, "cuda:0": 1 * GIB, "cuda:1": 1 * GIB})
    check_model_fits(cfg, cpu, None, {"host": 0})  # a plugin: not counted, not refused


def test_a_model_too_large_for_the_host_is_refused_at_preflight_before_it_is_built(monkeypatch):
    """The run's own path: the host's available memory is stood in (0.5 GiB), so a regression builds and trains
    an MLP of 21 M parameters for 2 steps (seconds), not one of the size that was accepted (3.2 B)."""
    import ddpviz.engine.runner as runner

    monkeypatch.setattr(runner, "available_memory", lambda plan: {"host": GIB // 2})
    built = []
    monkeypatch.setattr(runner, "build_model", lambda *a: built.append(a) or build_model(*a))
    cfg = validate_config(dict(model="mlp", width=2048, depth=6, mode="ddp", steps=2))
    result = run_training(cfg, ListSink(), "too-big")
    assert result.status == "failed" and result.error["stage"] == "pre-flight" and built == []
    # digits: 64 inputs, 10 classes; 64·2048 + 2048 + 5·(2048² + 2048) + 2048·10 + 10 = 21,135,370 parameters,
    # x 16 B (weights, gradients, 2 moments) x 2 ranks = 676,331,840 B = 0.63 GiB
    assert result.error["exception"] == (
        "width: the mlp model has 21.1 M parameters: ddp needs at least 0.6 GiB on this host (2 devices) for fp32 "
        "weights, gradients and AdamW's two moments, more than the 0.5 GiB this host has available; lower width or "
        "depth")
