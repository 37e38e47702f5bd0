"""Cases from the field, turn 3 (issue 25): each beside what plain PyTorch does with it.

1. a NaN / inf loss: plain torch trains on; ddpviz fails at the first non-finite step, naming it,
   in every mode, with a complete summary and its null + `_nonfinite` encoding
2. an empty validation split: refused before launch, never a made-up val_loss
3. DP on a torch.compile'd model: refused before launch with torch's reason, DDP offered
4. the field named: world_size vs the training samples; a plugin build() returning a dict
(6, gradient compression, is in test_comm_hooks.py.)
"""

from __future__ import annotations

import json
import math

import field_models
import pytest
import runs
import torch
import torch.nn as nn
import torch.nn.functional as F

from ddpviz.engine.config import RunConfig, validate_config
from ddpviz.engine.events import encode_json

FAST = dict(world_size=2, global_batch_size=16, eval_every=0, step_delay_s=0.0, lr=0.1, optimizer="sgd",
            probe=False)


pytestmark = pytest.mark.usefixtures("field_plugins")


def cfg_of(model: str, **fields) -> RunConfig:
    return validate_config({**FAST, "model": model, "steps": 6, **fields})


def run(cfg: RunConfig) -> tuple:
    return runs.train(cfg, f"{cfg.model}-{cfg.mode}", must_succeed=False)


# -- 1: a non-finite loss ---------------------------------------------------------------------------

def plain_single_losses(cfg: RunConfig) -> list[float]:
    """Plain torch on one device: the global batch of each step, F.cross_entropy, SGD."""
    from ddpviz.engine.data import BatchPlan, load_dataset
    from ddpviz.engine.models import build_model

    ds = load_dataset(cfg)
    model = build_model(cfg, ds)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    plan = BatchPlan(len(ds), cfg.world_size, cfg.micro_batch_per_device, cfg.seed)
    losses = []
    for step in range(cfg.steps):
        idx = plan.global_indices(step)
        loss = F.cross_entropy(model(ds.x_train[idx]), ds.y_train[idx])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def first_nonfinite(losses: list[float]) -> int:
    return next(i for i, v in enumerate(losses) if not math.isfinite(v))


@pytest.mark.parametrize("model,word", [("nanat3", "nan"), ("infat3", "inf")])
@pytest.mark.parametrize("mode", ["single", "dp"])
def test_a_nonfinite_loss_fails_at_its_step_like_plain_torch_first_shows_it(model, word, mode):
    cfg = cfg_of(model, mode=mode)
    plain = plain_single_losses(cfg)
    step = first_nonfinite(plain)  # plain torch: no error, the loss just turns non-finite
    assert step == field_models.BAD_STEP and str(plain[step]) == word
    result, sink = run(cfg)
    err = result.error
    assert result.status == "failed", result.summary
    assert (err["stage"], err["rank"], err["step"]) == ("training", 0, step)
    assert f"loss is {word}" in err["exception"]
    # the step that went non-finite is reported, encoded: null and its name
    last = sink.of_type("step")[-1]
    assert last["step"] == step and last["loss"] is None and last["loss_nonfinite"] == word
    # the losses before it are plain torch's
    got = [e["loss"] for e in sink.of_type("step")[:step]]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(plain[:step]), rtol=1e-5, atol=1e-6)
    finished = sink.of_type("run_finished")
    assert len(finished) == 1 and finished[0]["summary"]["final_loss_nonfinite"] == word
    assert finished[0]["summary"]["steps_done"] == step + 1
    for e in sink.events:  # strict JSON for every consumer (no NaN token)
        json.loads(encode_json(e), parse_constant=lambda c: pytest.fail(f"{c} in {e['type']}"))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_a_nan_loss_names_the_rank_and_step_plain_ddp_first_shows_it(mode):
    from plain_ddp import plain_ddp
    from ddpviz.workers.cli.progress import summary_line

    cfg = cfg_of("nanat3", mode=mode)
    ref = plain_ddp(cfg.model_copy(update={"mode": "ddp"}))
    per_rank = ref["losses"]  # plain DDP: every rank trains on, its loss turning NaN
    step = min(first_nonfinite(ls) for ls in per_rank)
    ranks = [r for r, ls in enumerate(per_rank) if not math.isfinite(ls[step])]
    assert (step, ranks) == (field_models.BAD_STEP, [field_models.BAD_RANK])
    result, sink = run(cfg)
    err = result.error
    assert result.status == "failed"
    assert (err["stage"], err["rank"], err["step"]) == ("training", ranks[0], step)
    assert "loss is nan" in err["exception"]
    assert len(sink.of_type("run_finished")) == 1
    s = result.summary
    assert s["final_loss"] is None and s["final_loss_nonfinite"] == "nan"
    assert s["steps_done"] >= step  # rank 0's steps: its own step `step` was finite
    line = summary_line("r", "failed", s, err)
    assert f"error (rank {ranks[0]} at step {step})" in line and "final loss nan" in line
    assert "Traceback" not in line


def test_the_summary_reads_null_and_named_losses_from_json():
    from ddpviz.engine.events import decode_json, make_event
    from ddpviz.engine.summary import SummaryBuilder

    b = SummaryBuilder()
    for rank, loss in ((0, 1.5), (1, float("inf"))):  # through JSON, as a rank's file carries them
        b.observe(decode_json(encode_json(make_event("step", "r", rank=rank, step=0, loss=loss,
                                                     samples=8, step_time_s=0.1))))
    s = b.summary()  # on main: TypeError (int + NoneType)
    assert (s["final_loss"], s["final_loss_nonfinite"]) == (None, "inf")


# -- 2: an empty validation split -----------------------------------------------------------------

@pytest.mark.parametrize("mode", ["single", "dp", "ddp", "fsdp"])
def test_an_empty_validation_split_is_refused_before_launch(mode):
    from ddpviz.engine.data import load_dataset

    cfg = cfg_of("noval", mode=mode)
    assert len(load_dataset(cfg).x_val) == 0
    # what the split gives plain torch: a mean over no samples is NaN, not 0.0
    assert math.isnan(F.cross_entropy(torch.zeros(0, 10), torch.zeros(0, dtype=torch.long)).item())
    result, sink = run(cfg)
    err = result.error
    assert result.status == "failed" and err["stage"] == "pre-flight" and err["rank"] is None
    assert err["exception"] == ("dataset: dataset 'digits-noval' has 0 validation samples: every run "
                                "evaluates on the validation split (eval_every and at the end); give "
                                "the dataset a validation split (Dataset.x_val, y_val)")
    assert [e["type"] for e in sink.events] == ["run_finished"]
    assert result.summary["val_loss"] is None and result.summary["val_accuracy"] is None


# -- 3: DP on a compiled model ----------------------------------------------------------------------

def test_torch_replicate_cannot_copy_a_compiled_module():
    """What DP's replicate does to a compiled module: `torch.nn.parallel.replicate` calls
    `_replicate_for_data_parallel` on every module, and for a compiled one that empties the
    original's parameters (device 0's model), where a plain module keeps them."""
    plain = nn.Linear(4, 2)
    plain._replicate_for_data_parallel()
    assert sorted(n for n, _ in plain.named_parameters()) == ["bias", "weight"]
    compiled = torch.compile(nn.Linear(4, 2), backend="eager")
    compiled._replicate_for_data_parallel()
    assert list(compiled._orig_mod.named_parameters()) == []


def test_dp_on_a_compiled_model_is_refused_before_launch_offering_ddp():
    result, sink = run(cfg_of("compiled", mode="dp"))
    err = result.error
    assert result.status == "failed" and err["stage"] == "pre-flight"
    assert err["exception"].startswith("mode: mode 'dp' cannot train a torch.compile'd model")
    assert "torch.nn.parallel.replicate cannot copy compiled modules" in err["exception"]
    assert "use mode 'ddp'" in err["exception"]
    assert [e["type"] for e in sink.events] == ["run_finished"]


def test_single_on_the_compiled_model_still_trains():
    result, _ = run(cfg_of("compiled", mode="single", steps=2))
    assert result.status == "succeeded", result.error


# -- 4: the field named -------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["dp", "ddp"])
def test_more_ranks_than_training_samples_names_world_size(mode):
    from torch.utils.data.distributed import DistributedSampler

    cfg = cfg_of("tiny3", mode=mode, world_size=4, global_batch_size=4)
    # PyTorch's sampler (drop_last, as ddpviz's BatchPlan) gives each of 4 ranks no sample of 3
    assert len(DistributedSampler(range(3), num_replicas=4, rank=0, drop_last=True, shuffle=False)) == 0
    result, _ = run(cfg)
    err = result.error
    assert err["stage"] == "pre-flight"
    assert err["exception"].startswith("world_size: world_size (4) is larger than the dataset's 3 "
                                       "training samples"), err["exception"]
    assert "global_batch_size" not in err["exception"]


def test_a_too_large_batch_still_names_global_batch_size():
    result, _ = run(cfg_of("tiny3", mode="ddp", world_size=1, global_batch_size=4))
    assert result.error["exception"].startswith("global_batch_size: global_batch_size is too large")


def test_a_plugin_build_returning_a_dict_is_named_at_plugin_build():
    from ddpviz.workers.cli.progress import summary_line

    with pytest.raises(AttributeError):  # what plain torch code does with it: {}.parameters()
        field_models.dictbuild.build(None).parameters()
    result, sink = run(cfg_of("dictbuild", mode="ddp"))
    err = result.error
    assert (result.status, err["stage"], err["rank"]) == ("failed", "plugin build", None)
    assert err["exception"] == "TypeError: build() must return an nn.Module (got dict)"
    assert "error (plugin build): TypeError: build() must return an nn.Module (got dict)" in \
        summary_line("r", "failed", result.summary, err)
    assert [e["type"] for e in sink.events] == ["run_finished"]


def test_the_cli_explains_a_nan_loss_without_a_traceback(capsys):
    from ddpviz.workers.cli import main

    with pytest.raises(SystemExit) as code:
        main(["train", "--model", "nanat3", "--mode", "single", "--world-size", "2", "--steps", "6",
              "--global-batch-size", "16", "--eval-every", "0", "--step-delay-s", "0", "--lr", "0.1",
              "--optimizer", "sgd"])
    out = capsys.readouterr()
    assert code.value.code != 0
    assert "error (rank 0 at step 3): NonFiniteLoss: loss is nan at step 3" in out.out
    assert "final loss nan" in out.out
    assert "Traceback" not in out.out + out.err
