"""DP and DDP must train exactly like one device on the same global batch.

Reference: `mode=single`, one device on the whole global batch. After k SGD steps the parameters
must match (`torch.testing.assert_close`). Tolerance: the modes sum the same per-sample gradients
in a different order (per-device partial sums, then a reduce), so float32 rounding differs by a few
ulps per step; rtol 1e-5 / atol 1e-6 is ~100x that after 5 steps of lr 0.1 on O(0.1) weights, and
~1000x below the change one step makes, so a missing average (2x) or a skipped bucket fails loudly.
"""

import pytest
import runs
import torch

from ddpviz.engine.config import RunConfig

TOL = dict(rtol=1e-5, atol=1e-6)
SMALL = dict(width=32, depth=2, global_batch_size=32, steps=5, lr=0.1, optimizer="sgd", eval_every=0)
GPT_SMALL = dict(model="gpt", dataset="text", width=32, depth=1, n_head=2, block_size=16,
                 global_batch_size=8, steps=4, lr=0.1, optimizer="sgd", eval_every=0)


def train(**fields):
    return runs.train(RunConfig(**fields))


def baseline(**fields):
    fields = {k: v for k, v in fields.items() if k not in ("bucket_cap_mb", "overlap")}
    return train(mode="single", **fields)[0].final_params


@pytest.mark.parametrize("fields", [
    dict(model="mlp", **SMALL),
    dict(model="cnn", **{**SMALL, "width": 8}),
    dict(world_size=4, model="mlp", **SMALL),
    GPT_SMALL,
    dict(model="mlp", grad_accum_steps=2, **SMALL),
], ids=["mlp", "cnn", "mlp-4-devices", "gpt", "mlp-grad-accum"])
def test_dp_matches_single(fields):
    result, sink = train(mode="dp", **fields)
    torch.testing.assert_close(result.final_params, baseline(**fields), **TOL)
    assert result.summary["replicas_in_sync"] is True
    phases = {e["phase"] for e in sink.of_type("dp_phase")}
    assert phases == {"broadcast", "scatter", "forward", "gather", "loss", "backward", "reduce", "optimizer"}


@pytest.mark.parametrize("accum", [1, 2])
def test_dp_on_one_device_is_the_module_itself_as_in_torch(accum):
    # torch's DataParallel on one device runs its module, no replicate, gather or reduce
    # (torch/nn/parallel/data_parallel.py: `if len(self.device_ids) == 1: return self.module(...)`)
    fields = dict(model="mlp", world_size=1, **{**SMALL, "grad_accum_steps": accum, "eval_every": 2})
    result, sink = train(mode="dp", **fields)
    torch.testing.assert_close(result.final_params, baseline(**fields), **TOL)
    assert {e["phase"] for e in sink.of_type("dp_phase")} == {"forward", "backward", "optimizer"}
    assert {e["sent_bytes"] + e["recv_bytes"] for e in sink.of_type("comm_volume")} == {0}
    assert result.summary["replicas_in_sync"] is True and all(len(e["checksums"]) == 1 for e in sink.of_type("sync"))


def test_single_really_trains_so_matching_it_means_something():
    before = train(mode="single", **{**SMALL, "steps": 1, "lr": 1e-9})[0].final_params
    after = baseline(model="mlp", **SMALL)
    assert (after - before).abs().max() > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("fields", [
    dict(model="mlp", bucket_cap_mb=0.01, **SMALL),
    dict(model="mlp", bucket_cap_mb=0.01, overlap=False, **SMALL),
    dict(model="cnn", bucket_cap_mb=25, gradient_as_bucket_view=True, **{**SMALL, "width": 8}),
    dict(**GPT_SMALL, grad_accum_steps=2, bucket_cap_mb=0.05),
], ids=["mlp-small-buckets", "mlp-no-overlap", "cnn-bucket-view", "gpt-grad-accum"])
def test_ddp_matches_single(fields):
    result, sink = train(mode="ddp", **fields)
    torch.testing.assert_close(result.final_params, baseline(**fields), **TOL)
    assert result.summary["replicas_in_sync"] is True
    ranks = {e["rank"] for e in sink.of_type("step")}
    assert ranks == {0, 1}


@pytest.mark.slow
def test_uneven_dataset_across_three_ranks_crosses_an_epoch_without_hanging():
    # 1,528 training digits / 3 ranks = 509.33: DistributedSampler(drop_last=True) gives each rank
    # 509, i.e. 50 batches of 10; 52 steps cross into epoch 1 (reshuffled) on every rank together.
    fields = dict(model="mlp", world_size=3, width=16, depth=1, global_batch_size=30, steps=52, lr=0.1, optimizer="sgd",
                  eval_every=0, step_delay_s=0)
    result, sink = train(mode="ddp", **fields)
    assert sink.of_type("run_started")[0]["sampler"]["drop_last"] is True
    assert {e["rank"] for e in sink.of_type("step")} == {0, 1, 2}
    torch.testing.assert_close(result.final_params, baseline(**fields), **TOL)


def test_a_sets_single_run_is_recorded_as_one_device_with_the_whole_batch():
    # the trio's single run keeps the set's world_size 2 in its config (it computes 2 devices' global batch on
    # one): its run_started said world_size 2 and micro-batch 16 of 32 (a new user's export, 2026-12-06)
    result, sink = train(mode="single", world_size=2, **{**SMALL, "steps": 2})
    (started,) = sink.of_type("run_started")
    assert started["config"]["world_size"] == 2  # as asked
    assert started["world_size"] == 1 and started["micro_batch_per_device"] == SMALL["global_batch_size"]
    assert {e["samples"] for e in sink.of_type("step")} == {SMALL["global_batch_size"]}
