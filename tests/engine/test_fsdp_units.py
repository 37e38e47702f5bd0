"""FSDP without processes: the config rules, the unit policy, pre-flight refusals and the formulas.

References: the models' own module trees (which blocks exist), FSDP2's documented dim-0
padding (each rank holds ceil(d0 / n) rows), and hand-worked byte counts.
"""

import pytest
import torch
import torch.nn as nn

from ddpviz.engine.components.devices import DevicePlan, PreflightError
from ddpviz.engine.config import ConfigError, RunConfig, validate_config
from ddpviz.engine.data import load_dataset
from ddpviz.engine.harness.compare import mode_config
from ddpviz.engine.models import build_model
from ddpviz.engine.modes.fsdp.collectives import theory_bytes, volume_fields, wire_factor
from ddpviz.engine.modes.fsdp.units import check_fsdp, fsdp_preview, unit_layout, unit_modules

CPU_PLAN = DevicePlan("cpu", ["cpu:0", "cpu:1"], "gloo", emulated=False)


def refused(**fields) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        validate_config(fields)
    return dict(info.value.errors)


@pytest.mark.parametrize("fields, field, words", [
    ({"mode": "ddp", "reshard_after_forward": False}, "reshard_after_forward", "needs mode 'fsdp'"),
    ({"mode": "dp", "fsdp_param_dtype": "bfloat16"}, "fsdp_param_dtype", "needs mode 'fsdp'"),
    ({"mode": "single", "fsdp_reduce_dtype": "bfloat16"}, "fsdp_reduce_dtype", "needs mode 'fsdp'"),
    ({"mode": "fsdp", "amp": True, "fsdp_param_dtype": "bfloat16"}, "amp", "use one"),
    ({"mode": "fsdp", "fsdp_param_dtype": "float16"}, "fsdp_param_dtype", "must be one of"),
    ({"mode": "fsdp", "nnodes": 2, "world_size": 4}, "nnodes", "needs mode 'ddp'"),
])
def test_fsdp_knobs_are_refused_by_name(fields, field, words):
    errors = refused(**fields)
    assert field in errors and words in errors[field], errors


def test_fsdp_config_with_every_knob_is_valid():
    cfg = validate_config(dict(mode="fsdp", reshard_after_forward=False, fsdp_param_dtype="bfloat16",
                               fsdp_reduce_dtype="float32", fault="hang", fault_step=1))
    assert (cfg.mode, cfg.reshard_after_forward, cfg.fsdp_param_dtype) == ("fsdp", False, "bfloat16")


def test_compare_gives_the_other_modes_default_fsdp_knobs():
    cfg = validate_config(dict(mode="fsdp", reshard_after_forward=False, fsdp_param_dtype="bfloat16"))
    ddp = mode_config(cfg, "ddp")
    assert (ddp.mode, ddp.reshard_after_forward, ddp.fsdp_param_dtype) == ("ddp", True, "float32")
    assert mode_config(cfg, "fsdp").reshard_after_forward is False


@pytest.mark.parametrize("model, extra, expected", [
    ("mlp", {}, ["hidden.0", "hidden.1", "hidden.2"]),
    ("cnn", {}, ["convs.0", "convs.1", "convs.2"]),
    ("gpt", {"dataset": "text", "width": 32, "n_head": 2, "depth": 2, "block_size": 16}, ["blocks.0", "blocks.1"]),
])
def test_units_are_the_models_blocks_and_the_root_holds_the_rest(model, extra, expected):
    cfg = RunConfig(mode="fsdp", model=model, **{"width": 16, "depth": 3, **extra})
    m = build_model(cfg, load_dataset(cfg))
    assert [n for n, _ in unit_modules(m)] == expected
    layout = unit_layout(m, cfg)
    assert [u["unit"] for u in layout] == expected + ["root"]
    # every trainable parameter is in exactly one unit (the GPT's tied embedding once)
    names = [p for u in layout for p in u["param_names"]]
    assert sorted(names) == sorted(n for n, _ in m.named_parameters())
    assert sum(u["numel"] for u in layout) == sum(p.numel() for p in m.parameters())


def test_unit_bytes_follow_fsdp2_dim0_padding():
    # mlp 64 -> 16 -> 10 on 3 ranks: hidden.0 weight (16, 64) pads to 18 rows, bias 16 -> 18;
    # head weight (10, 16) pads to 12 rows, bias 10 -> 12 (hand-worked)
    cfg = RunConfig(mode="fsdp", model="mlp", width=16, depth=1, world_size=3, global_batch_size=30)
    layout = {u["unit"]: u for u in unit_layout(build_model(cfg, load_dataset(cfg)), cfg)}
    assert layout["hidden.0"]["gather_bytes"] == (18 * 64 + 18) * 4
    assert layout["root"]["gather_bytes"] == (12 * 16 + 12) * 4
    assert layout["root"]["shard_bytes"] == (4 * 16 + 4) * 4


class OneLinear(nn.Module):
    def __init__(self, sparse: bool = False):
        super().__init__()
        self.emb = nn.Embedding(10, 4, sparse=sparse)
        self.out = nn.Linear(4, 10)

    def forward(self, x):
        return self.out(self.emb(x))


def test_a_model_without_blocks_is_one_unit_and_the_preview_says_so():
    cfg = RunConfig(mode="fsdp")
    preview = fsdp_preview(cfg, OneLinear())
    assert [u["unit"] for u in preview["units"]] == ["root"]
    assert "no sub-modules to shard" in preview["note"]
    assert fsdp_preview(cfg, build_model(cfg, load_dataset(cfg)))["note"] is None


def test_sparse_gradients_are_refused_naming_the_module():
    with pytest.raises(PreflightError) as info:
        check_fsdp(RunConfig(mode="fsdp"), CPU_PLAN, OneLinear(sparse=True))
    assert info.value.field == "model" and "emb" in str(info.value) and "sparse" in str(info.value)
    check_fsdp(RunConfig(mode="fsdp"), CPU_PLAN, OneLinear(sparse=False))  # dense: fine


def test_a_backend_without_reduce_scatter_is_refused():
    plan = DevicePlan("cpu", ["cpu:0", "cpu:1"], "mpi", emulated=False)
    with pytest.raises(PreflightError) as info:
        check_fsdp(RunConfig(mode="fsdp"), plan, OneLinear())
    assert info.value.field == "backend" and "reduce-scatter" in str(info.value)


def test_theory_bytes_hand_worked():
    # P = 1000 fp32 parameters = 4000 bytes, n = 4: (n-1)/n = 0.75
    with_reshard = theory_bytes(4, 1000, reshard_after_forward=True)
    assert with_reshard == {"fsdp": 9000, "ddp": 6000}  # 3 x 0.75 x 4000; 2 x 0.75 x 4000
    assert theory_bytes(4, 1000, reshard_after_forward=False)["fsdp"] == 6000
    # bf16 all-gathers (2 bytes), fp32 reduce: 0.75 x (2 x 2000 + 4000)
    assert theory_bytes(4, 1000, reshard_after_forward=True, gather_dtype_bytes=2)["fsdp"] == 6000
    assert theory_bytes(1, 1000, reshard_after_forward=True) == {"fsdp": 0, "ddp": 0}


def test_wire_bytes_use_the_backends_algorithm():
    records = [dict(kind="all_gather", nbytes=3000), dict(kind="reduce_scatter", nbytes=3000)]
    theory = {"fsdp": 0, "ddp": 0}
    gloo = volume_fields(records, "gloo", 3, theory, "")
    nccl = volume_fields(records, "nccl", 3, theory, "")
    assert gloo["sent_bytes"] == 2000 + 4000  # gloo reduce-scatter = all-reduce: 2(n-1)/n
    assert nccl["sent_bytes"] == 2000 + 2000
    assert (gloo["all_gather_nbytes"], gloo["reduce_scatter_nbytes"]) == (3000, 3000)
    assert wire_factor("all_gather", "gloo", 1) == 0.0


def test_a_torch_without_fsdp2s_private_collectives_trains_unrecorded(monkeypatch):
    """The recorders subclass FSDP2's private default collectives; a torch that moved them (older
    or newer than 2.13) gets a run without collective events and a sentence saying why, not an
    ImportError in every rank."""
    from types import SimpleNamespace

    import ddpviz.engine.modes.fsdp.collectives as col
    from ddpviz.engine.modes.fsdp.step import StepRunner

    def moved():
        raise ImportError(f"No module named '{col.PRIVATE_COLLECTIVES}'")

    monkeypatch.setattr(col, "_gather_types", moved)
    log = col.CollectiveLog()
    why = col.install_recorders([("blocks.0", object())], log)
    assert log.recording is False and why.startswith("FSDP collectives not recorded")
    assert torch.__version__ in why and col.PRIVATE_COLLECTIVES in why
    emitted = []
    StepRunner._emit_comm(SimpleNamespace(log=log, tel=SimpleNamespace(emit=lambda *a, **k: emitted.append(a))), 3, [])
    assert emitted == []  # no comm_volume of 0 bytes passed off as measured


def test_an_fsdp_module_without_the_custom_comm_hooks_is_named(monkeypatch):
    import ddpviz.engine.modes.fsdp.collectives as col

    monkeypatch.setattr(col, "_gather_types", lambda: (object, object))
    log = col.CollectiveLog()
    why = col.install_recorders([("root", object())], log)
    assert log.recording is False and "has no set_custom_all_gather or set_custom_reduce_scatter" in why
