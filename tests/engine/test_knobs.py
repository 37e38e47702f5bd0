"""Every DDP knob runs and reports what it should (static_graph, amp, adamw, compare)."""

import pytest
import torch

from ddpviz.engine.config import RunConfig
from ddpviz.engine.events import ListSink
from ddpviz.engine.harness.compare import compare
from ddpviz.engine.run import run_training

pytestmark = pytest.mark.slow
SMALL = dict(model="mlp", width=32, depth=2, global_batch_size=32, steps=4, eval_every=2)


def test_static_graph_adamw_and_amp_train_in_sync_with_single():
    fields = dict(SMALL, optimizer="adamw", lr=1e-3, static_graph=True)
    ddp = run_training(RunConfig(mode="ddp", **fields), ListSink(), "s")
    single = run_training(RunConfig(mode="single", **fields), ListSink(), "t")
    assert ddp.status == "succeeded", ddp.error
    # AdamW divides by sqrt(v): tiny gradient rounding differences are amplified where v ~ 0
    torch.testing.assert_close(ddp.final_params, single.final_params, rtol=1e-4, atol=1e-5)
    amp = run_training(RunConfig(mode="ddp", amp=True, **SMALL), ListSink(), "u")
    assert amp.status == "succeeded" and amp.summary["replicas_in_sync"] is True


def test_compare_reports_every_mode_against_single():
    report = compare(RunConfig(**SMALL, lr=0.1, optimizer="sgd", bucket_cap_mb=0.005))
    assert set(report) == {"single", "dp", "ddp"}
    assert report["single"]["speedup_vs_single"] == pytest.approx(1.0)
    for mode in ("dp", "ddp"):
        r = report[mode]
        assert r["status"] == "succeeded" and r["replicas_in_sync"] is True
        assert r["max_param_diff_vs_single"] < 1e-5
        assert set(r["step_time_split"]) == {"step_time_s", "forward_s", "backward_s", "comm_exposed_s", "optimizer_s"}
        assert set(r["bytes_per_device"]) == {"cpu:0", "cpu:1"}
    # the global-batch loss: DDP averages its ranks' shard losses (not rank 0's alone)
    for mode in ("dp", "ddp"):
        assert report[mode]["final_loss"] == pytest.approx(report["single"]["final_loss"], rel=1e-5)
    # measured peaks: DP's device 0 holds the master copy, gathered outputs and reduced gradients
    assert report["dp"]["memory_imbalance"] > 1.0
    assert report["ddp"]["memory_imbalance"] < 1.05
    assert report["single"]["replicas_in_sync"] is None  # one device: nothing to compare
