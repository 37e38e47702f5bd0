"""FSDP's knobs and edges, each run for real on gloo: mixed precision (and gloo's bf16
reduce-scatter), a model with one unit only, the GPT at width 256 against what a DDP rank must
hold, and `ddpviz compare --modes`.
"""

import json
import math
import sys
import textwrap

import pytest
import runs
import torch

from ddpviz.engine.config import RunConfig
from ddpviz.engine.data import load_dataset
from ddpviz.engine.events import ListSink
from ddpviz.engine.models import build_model
from ddpviz.engine.run import run_training

pytestmark = pytest.mark.slow
SMALL = dict(model="mlp", width=32, depth=2, global_batch_size=32, steps=5, lr=0.1, optimizer="sgd", eval_every=0, step_delay_s=0)


def train(**fields):
    return runs.train(RunConfig(**fields), "knobs")


def padded_fp32_bytes(model, prefix, n=2):
    return sum(math.ceil(p.shape[0] / n) * n * math.prod(p.shape[1:])
               for name, p in model.named_parameters() if name.startswith(prefix)) * 4


@pytest.mark.parametrize("reduce_dtype", ["float32", "bfloat16"])
def test_bf16_parameters_halve_the_gathers_and_reduce_in_the_dtype_asked(reduce_dtype):
    result, sink = train(mode="fsdp", fsdp_param_dtype="bfloat16", fsdp_reduce_dtype=reduce_dtype, **SMALL)
    cfg = RunConfig(mode="single", **SMALL)
    full = padded_fp32_bytes(build_model(cfg, load_dataset(cfg)), "hidden.0.")
    evs = [e for e in sink.of_type("fsdp_collective") if e["unit"] == "hidden.0" and e["step"] == 4]
    gathers = [e for e in evs if e["kind"] == "all_gather"]
    scatters = [e for e in evs if e["kind"] == "reduce_scatter"]
    assert gathers and all(e["dtype"] == "bfloat16" and e["nbytes"] == full // 2 for e in gathers)
    reduce_bytes = full if reduce_dtype == "float32" else full // 2  # gloo reduce-scatters bf16 too
    assert scatters and all(e["dtype"] == reduce_dtype and e["nbytes"] == reduce_bytes for e in scatters)
    # it trains, near the fp32 single run but measurably not equal to it (bf16 compute)
    single = train(**{**SMALL, "mode": "single"})[0].final_params
    diff = float((result.final_params - single).abs().max())
    assert 1e-5 < diff < 5e-3


@pytest.fixture(scope="module")
def one_unit_plugin(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp_site")
    (root / "flat_plugin.py").write_text(textwrap.dedent('''
        import torch.nn as nn
        from ddpviz.engine.data import load_dataset
        from ddpviz.engine.plugins import ModelPlugin

        plugin = ModelPlugin(build=lambda cfg: nn.Sequential(nn.Linear(64, 24), nn.ReLU(), nn.Linear(24, 10)),
                             dataset=lambda cfg: load_dataset(cfg.model_copy(update={"model": "mlp"})))
    '''))
    info = root / "ddpviz_fsdp_test_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ddpviz-fsdp-test-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[ddpviz.models]\nflatseq = flat_plugin:plugin\n")
    sys.path.insert(0, str(root))
    yield "flatseq"
    sys.path.remove(str(root))


def test_a_model_without_blocks_runs_as_one_unit_and_says_so(one_unit_plugin):
    fields = {**SMALL, "model": one_unit_plugin}
    result, sink = train(mode="fsdp", **fields)
    started = sink.of_type("run_started")[0]
    assert [u["unit"] for u in started["fsdp_units"]["units"]] == ["root"]
    assert "no sub-modules to shard" in started["fsdp_units"]["note"]
    assert any("no sub-modules to shard" in e["message"] for e in sink.of_type("log"))
    assert {e["unit"] for e in sink.of_type("fsdp_collective")} == {"root"}
    single = train(mode="single", **fields)[0].final_params
    torch.testing.assert_close(result.final_params, single, rtol=1e-5, atol=1e-6)


def test_gpt_width_256_peak_per_rank_is_below_what_any_ddp_rank_must_hold():
    # A DDP rank holds the full parameters, full gradients and (AdamW) two full moments at the end
    # of a step: 4 P, counted from the model, whatever else it holds. FSDP's measured peak per
    # rank, transient gathers and activations included, must stay below it. Four blocks, so that
    # one unit is a quarter of P: at depth 2 a block is half of P, and a sample that caught a
    # second unsharded block (its gathered parameters or unreduced gradients) measured 4.089 P
    # instead of 3.597 P (3 runs here; one CI run failed on it); at depth 4: 3.031-3.094 P.
    fields = dict(model="gpt", dataset="synthetic", width=256, depth=4, n_head=4, block_size=32,
                  global_batch_size=8, steps=2, optimizer="adamw", lr=1e-3, eval_every=0, step_delay_s=0)
    result, sink = train(mode="fsdp", **fields)
    cfg = RunConfig(mode="ddp", **fields)
    P = sum(p.numel() for p in build_model(cfg, load_dataset(cfg)).parameters()) * 4
    peaks = result.summary["peak_memory_bytes"]
    assert set(peaks) == {"cpu:0", "cpu:1"}
    for device, peak in peaks.items():
        # Below DDP's floor; and above what FSDP itself must hold at step 1's end of backward on
        # 2 ranks: shards of parameters and gradients (P/2 each) and of both moments (P), 2 P
        # less a few rows the last rank's uneven shards lack.
        assert 1.9 * P < peak < 4 * P, (device, peak, P)


def test_compare_cli_runs_the_modes_asked_for(capsys):
    from ddpviz.workers.cli.commands import main

    with pytest.raises(SystemExit) as info:
        main(["compare", "--json", "--modes", "single,fsdp", "--steps", "3", "--width", "16", "--depth", "1",
              "--step-delay-s", "0", "--eval-every", "0", "--no-reshard-after-forward"])
    assert info.value.code == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report) == ["single", "fsdp"]
    assert report["fsdp"]["status"] == "succeeded" and report["fsdp"]["max_param_diff_vs_single"] < 1e-6
    assert report["fsdp"]["peak_memory_bytes"]


def test_compare_cli_refuses_an_unknown_mode(capsys):
    from ddpviz.workers.cli.commands import main

    with pytest.raises(SystemExit) as info:
        main(["compare", "--modes", "single,zero3"])
    assert info.value.code == 2 and "--modes" in capsys.readouterr().err


def test_a_failing_fsdp_rank_fails_the_run_naming_it():
    sink = ListSink()
    result = run_training(RunConfig(mode="fsdp", fault="raise", fault_rank=1, fault_step=2, **SMALL), sink, "fault")
    assert result.status == "failed"
    assert result.error["rank"] == 1 and "injected fault: rank 1 raised at step 2" in result.error["exception"]
