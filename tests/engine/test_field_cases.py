"""Cases from the field (issue 12): models people bring, each checked against plain PyTorch or the
case's own arithmetic.

1. a head computed but not returned, with static_graph: trains, equal to plain DDP(static_graph=True)
2. BatchNorm on each half of the batch: the probe uses a real micro-batch; trains like plain DDP
3. failures name their stage (plugin build, pre-flight, rank N at step S) and keep the traceback
4. outputs as a dict with `logits` or a tuple: every mode trains, DP and DDP equal single
5. labels beyond the logits: refused before launch, naming both numbers
6. a sparse embedding: its own bucket, as plain DDP builds it, counted as values + indices
"""

from __future__ import annotations

import pytest
import runs
import torch
import torch.nn.functional as F

from ddpviz.engine.config import RunConfig, validate_config

FAST = dict(world_size=2, global_batch_size=16, eval_every=0, step_delay_s=0.0, lr=0.1, optimizer="sgd")


pytestmark = pytest.mark.usefixtures("field_plugins")


def cfg_of(model: str, **fields) -> RunConfig:
    return validate_config({**FAST, "model": model, "steps": 3, **fields})


def run(cfg: RunConfig) -> tuple:
    return runs.train(cfg, f"{cfg.model}-{cfg.mode}", must_succeed=False)


# -- 1, 2: the pre-flight follows what DDP accepts, on a real micro-batch --------------------------

@pytest.mark.slow
def test_a_static_graph_model_with_an_always_unused_head_trains_like_plain_ddp():
    from plain_ddp import plain_ddp

    cfg = cfg_of("twoheads", mode="ddp", static_graph=True, steps=4)
    result, sink = run(cfg)
    assert result.status == "succeeded", result.error
    assert result.summary["replicas_in_sync"] is True
    ref = plain_ddp(cfg)
    assert ref["in_sync"] is True
    torch.testing.assert_close(result.final_params, ref["params"], rtol=1e-5, atol=1e-6)
    # the preview's layouts are the ones plain DDP reports: one bucket of every parameter's bytes
    preview = sink.of_type("run_started")[0]["bucket_preview"]
    assert [b["nbytes"] for b in preview["initial"]] == [int(s) for s in str(ref["logging"]["bucket_sizes"]).split(",")]


def test_without_static_graph_the_unused_head_is_refused_before_launch():
    result, sink = run(cfg_of("twoheads", mode="ddp"))
    assert result.status == "failed" and result.error["stage"] == "pre-flight"
    assert "head_b.weight" in result.error["exception"] and "static_graph" in result.error["exception"]
    assert [e["type"] for e in sink.events] == ["run_finished"]


def test_the_probe_is_one_real_micro_batch_and_leaves_the_model_untouched():
    from ddpviz.engine.components.preflight import check_model, probe_batch
    from ddpviz.engine.data import load_dataset
    from ddpviz.engine.models import build_model

    cfg = cfg_of("bnhalves", mode="ddp", global_batch_size=32)
    ds = load_dataset(cfg)
    x, _ = probe_batch(cfg, ds)
    assert x.shape[0] == 32 // 2  # global batch / world_size: what rank 0 trains on
    model = build_model(cfg, ds)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    check_model(cfg, model, ds)  # on main: "Expected more than 1 value per channel" (1-sample halves)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k  # BatchNorm's running stats are not moved by the probe
    assert torch.equal(torch.get_rng_state(), rng)


@pytest.mark.slow
def test_batchnorm_on_each_half_trains_in_sync_like_plain_ddp():
    from plain_ddp import plain_ddp

    cfg = cfg_of("bnhalves", mode="ddp", steps=4)
    result, _ = run(cfg)
    assert result.status == "succeeded", result.error
    assert result.summary["replicas_in_sync"] is True
    ref = plain_ddp(cfg)
    torch.testing.assert_close(result.final_params, ref["params"], rtol=1e-5, atol=1e-6)


# -- 3: the stage that failed ---------------------------------------------------------------------

def test_a_plugin_whose_build_raises_fails_at_plugin_build_with_its_traceback():
    from ddpviz.workers.cli.progress import summary_line

    result, sink = run(cfg_of("boom", mode="ddp"))
    err = result.error
    assert result.status == "failed" and err["stage"] == "plugin build" and err["rank"] is None
    assert "plugin build exploded on purpose" in err["exception"]
    assert "field_models.py" in err["traceback"] and "_boom" in err["traceback"]
    assert [e["type"] for e in sink.events] == ["run_finished"]  # no rank ever started
    assert "error (plugin build): RuntimeError" in summary_line("r", "failed", result.summary, err)


def test_a_plugin_whose_data_is_missing_fails_at_dataset():
    result, _ = run(cfg_of("nodata", mode="single"))
    assert (result.error["stage"], result.error["rank"]) == ("dataset", None)
    assert "letters.npz" in result.error["exception"] and "_no_data" in result.error["traceback"]


@pytest.mark.slow
def test_a_rank_failure_names_the_rank_and_the_step():
    from ddpviz.workers.cli.progress import summary_line

    result, _ = run(validate_config(dict(FAST, mode="ddp", width=16, depth=1, steps=6, fault="raise",
                                         fault_rank=1, fault_step=2)))
    err = result.error
    assert (err["stage"], err["rank"], err["step"]) == ("training", 1, 2)
    assert "error (rank 1 at step 2)" in summary_line("r", "failed", result.summary, err)


def test_a_dp_device_failure_names_the_device_and_the_step():
    result, _ = run(validate_config(dict(FAST, mode="dp", width=16, depth=1, steps=6, fault="raise",
                                         fault_rank=1, fault_step=3)))
    assert (result.error["stage"], result.error["rank"], result.error["step"]) == ("training", 1, 3)
    assert "maybe_fail" in result.error["traceback"]


# -- 4: model outputs --------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("model", ["dictout", "tupleout"])
def test_dict_and_tuple_outputs_train_in_every_mode_like_single(model):
    results = {m: run(cfg_of(model, mode=m))[0] for m in ("single", "dp", "ddp")}
    for mode, r in results.items():
        assert r.status == "succeeded", (mode, r.error)
    for mode in ("dp", "ddp"):
        torch.testing.assert_close(results[mode].final_params, results["single"].final_params,
                                   rtol=1e-5, atol=1e-6)


def test_single_with_a_dict_output_equals_plain_torch_on_its_logits():
    from ddpviz.engine.data import BatchPlan, load_dataset
    from ddpviz.engine.models import build_model

    cfg = cfg_of("dictout", mode="single")
    result, _ = run(cfg)
    ds = load_dataset(cfg)
    model = build_model(cfg, ds)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    plan = BatchPlan(len(ds), cfg.world_size, cfg.micro_batch_per_device, cfg.seed)
    for step in range(cfg.steps):
        idx = plan.global_indices(step)
        F.cross_entropy(model(ds.x_train[idx])["logits"], ds.y_train[idx]).backward()
        opt.step()
        opt.zero_grad()
    mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    torch.testing.assert_close(result.final_params, mine, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["single", "dp", "ddp"])
def test_an_output_without_logits_is_refused_naming_the_rule(mode):
    result, sink = run(cfg_of("scoresout", mode=mode))
    assert result.status == "failed" and result.error["stage"] == "pre-flight"
    assert "under the key 'logits'" in result.error["exception"] and "scores" in result.error["exception"]
    assert [e["type"] for e in sink.events] == ["run_finished"]


# -- 5: labels beyond the model's outputs ----------------------------------------------------------

@pytest.mark.parametrize("mode", ["single", "dp", "ddp"])
def test_labels_beyond_the_logits_are_refused_before_launch(mode):
    with pytest.raises(IndexError):  # what plain torch does at the first step: label 26 of 10 logits
        F.cross_entropy(torch.zeros(1, 10), torch.tensor([26]))
    result, sink = run(cfg_of("letters27", mode=mode))
    err = result.error
    assert result.status == "failed" and err["stage"] == "pre-flight"
    assert err["exception"].startswith("dataset: ")
    assert "[0, 10)" in err["exception"] and "0..26 (27 classes)" in err["exception"]
    assert [e["type"] for e in sink.events] == ["run_finished"]


# -- 6: sparse gradients -------------------------------------------------------------------------------

def sparse_preview(cfg):
    from ddpviz.engine.components.preflight import probe_batch
    from ddpviz.engine.data import load_dataset
    from ddpviz.engine.models import build_model
    from ddpviz.engine.modes.ddp.buckets import preview_buckets

    ds = load_dataset(cfg)
    return preview_buckets(cfg, build_model(cfg, ds), *probe_batch(cfg, ds))


def test_a_sparse_embedding_gets_its_own_bucket_counted_as_values_and_indices():
    cfg = cfg_of("sparseemb", mode="ddp")
    p = sparse_preview(cfg)
    micro = cfg.micro_batch_per_device  # 8 ids per rank: 8 rows of 4 floats and 8 int64 indices
    sparse_bytes = micro * 4 * 4 + micro * 1 * 8
    dense_bytes = (4 * 4 + 4) * 4  # Linear(4, 4)
    for layout in (p["initial"], p["rebuilt"]):
        by_sparse = {b["sparse"]: b for b in layout}
        assert len(layout) == 2 and set(by_sparse) == {True, False}
        assert by_sparse[True]["param_names"] == ["emb.weight"] and by_sparse[True]["nbytes"] == sparse_bytes
        assert sorted(by_sparse[False]["param_names"]) == ["lin.bias", "lin.weight"]
        assert by_sparse[False]["nbytes"] == dense_bytes


@pytest.mark.slow
def test_the_sparse_layout_is_the_one_plain_ddp_builds_and_the_run_reports():
    from plain_ddp import plain_ddp

    cfg = cfg_of("sparseemb", mode="ddp", steps=4)
    ref = plain_ddp(cfg)["logging"]
    p = sparse_preview(cfg)
    names = ["emb.weight", "lin.weight", "lin.bias"]  # DDP's parameter indices
    ref_rebuilt = [[names[int(i)] for i in b.split()] for b in ref["rebuilt_per_bucket_param_indices"].split(",")]
    assert [b["param_names"] for b in p["rebuilt"]] == ref_rebuilt
    ref_sizes = [int(s) for s in ref["rebuilt_bucket_sizes"].split(",")]  # DDP logs dense sizes
    assert [b["nbytes"] for b in p["rebuilt"] if not b["sparse"]] == \
        [s for s, b in zip(ref_sizes, p["rebuilt"]) if not b["sparse"]]
    result, sink = run(cfg)
    assert result.status == "succeeded", result.error
    micro = cfg.micro_batch_per_device  # each rank's sparse gradient: micro rows of 4 floats + micro int64 ids
    sparse_sent = {e["nbytes"] for e in sink.of_type("bucket") if e["num_params"] == 1 and
                   e.get("param_names", ["emb.weight"]) == ["emb.weight"] and e["step"] >= 1}
    assert sparse_sent == {micro * 4 * 4 + micro * 8}, sparse_sent
    for step, layout in ((0, p["initial"]), (2, p["rebuilt"])):
        got = sorted((e for e in sink.of_type("bucket") if e["rank"] == 0 and e["step"] == step),
                     key=lambda e: e["bucket_index"])
        assert [e["nbytes"] for e in got] == [b["nbytes"] for b in layout], step
