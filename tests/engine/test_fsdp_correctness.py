"""FSDP must train exactly like one device on the same global batch, as DP and DDP do.

Reference: `mode=single` on the same global batches; after k SGD steps the full parameters (every
shard gathered) must match within DP's and DDP's tolerance (tests/engine/test_correctness.py:
rtol 1e-5 / atol 1e-6, ~1000x below one step's change, so a missing average or a lost shard
fails loudly). Reduce-scatter sums per-rank partial gradients in another order than one device,
so float32 rounding differs by a few ulps, as in DDP.
"""

import pytest
import runs
import torch

from ddpviz.engine.config import RunConfig

pytestmark = pytest.mark.slow
TOL = dict(rtol=1e-5, atol=1e-6)
SMALL = dict(width=32, depth=2, global_batch_size=32, steps=5, lr=0.1, optimizer="sgd", eval_every=0, step_delay_s=0)
GPT_SMALL = dict(model="gpt", dataset="text", width=32, depth=2, n_head=2, block_size=16,
                 global_batch_size=8, steps=4, lr=0.1, optimizer="sgd", eval_every=0, step_delay_s=0)
FSDP_ONLY = ("reshard_after_forward", "fsdp_param_dtype", "fsdp_reduce_dtype")


def train(**fields):
    return runs.train(RunConfig(**fields))


def baseline(**fields):
    return train(mode="single", **{k: v for k, v in fields.items() if k not in FSDP_ONLY})[0].final_params


def collectives(sink, rank=0):
    """{(unit, kind, phase)} of one rank's collectives at its last sampled step."""
    evs = [e for e in sink.of_type("fsdp_collective") if e["rank"] == rank]
    last = max(e["step"] for e in evs)
    return {(e["unit"], e["kind"], e["phase"]) for e in evs if e["step"] == last}


@pytest.mark.parametrize("fields", [
    dict(model="mlp", **SMALL),
    dict(model="cnn", reshard_after_forward=False, **{**SMALL, "width": 8}),
    dict(**GPT_SMALL, grad_accum_steps=2),
], ids=["mlp", "cnn-no-reshard", "gpt-grad-accum"])
def test_fsdp_matches_single(fields):
    result, sink = train(mode="fsdp", **fields)
    torch.testing.assert_close(result.final_params, baseline(**fields), **TOL)
    assert {e["rank"] for e in sink.of_type("step")} == {0, 1}
    curves = {(e["rank"], e["step"]) for e in sink.of_type("fsdp_memory_curve")}
    assert curves == {(e["rank"], e["step"]) for e in sink.of_type("step") if e.get("memory_traced")}
    assert curves == {(e["rank"], e["step"]) for e in sink.of_type("memory")}
    seen = collectives(sink)
    backward_gathers = {u for u, k, p in seen if k == "all_gather" and p == "backward"}
    if fields.get("reshard_after_forward", True):
        assert backward_gathers, seen  # every non-root unit is gathered again for backward
        assert "root" not in backward_gathers  # FSDP2 keeps the root unsharded after forward
    else:
        assert backward_gathers == set(), seen


def test_fsdp_uneven_dataset_across_three_ranks_crosses_an_epoch():
    # As the DDP test: 1,528 digits / 3 ranks, drop_last, 52 steps cross into epoch 1; width 16
    # on 3 ranks also pads every weight's 16 rows to 18 (FSDP2 shards dim 0 evenly).
    fields = dict(model="mlp", world_size=3, width=16, depth=1, global_batch_size=30, steps=52, lr=0.1, optimizer="sgd",
                  eval_every=0, step_delay_s=0)
    result, sink = train(mode="fsdp", **fields)
    assert {e["rank"] for e in sink.of_type("step")} == {0, 1, 2}
    torch.testing.assert_close(result.final_params, baseline(**fields), **TOL)


def test_fsdp_on_one_rank_trains_like_single_and_moves_nothing():
    fields = dict(model="mlp", world_size=1, **SMALL)
    result, sink = train(mode="fsdp", **fields)
    torch.testing.assert_close(result.final_params, baseline(**fields), **TOL)
    assert sink.of_type("fsdp_collective") == []
    assert {e["sent_bytes"] for e in sink.of_type("comm_volume")} == {0}
