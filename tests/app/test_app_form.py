"""The Launch form's pure parts: it covers RunConfig and refuses what validate_config refuses."""

from ddpviz.app import form
from ddpviz.engine.config import RunConfig


def test_form_shows_every_runconfig_field_once():
    fields = form.form_fields()
    assert len(fields) == len(set(fields))
    assert set(fields) == set(RunConfig.model_fields)  # a new field must get a widget


def test_defaults_and_kinds_follow_runconfig():
    d = form.defaults()
    assert (d["world_size"], d["bucket_cap_mb"], d["mode"]) == (2, 25.0, "ddp")
    assert form.kind("mode") == "choice" and form.choices("mode") == ["dp", "ddp", "fsdp", "single"]
    assert form.kind("overlap") == "bool" and form.kind("steps") == "int"
    assert form.kind("lr") == "float" and "mlp" in form.choices("model")


def test_validation_errors_name_fields():
    assert form.validation_errors(form.defaults()) == []
    errs = form.validation_errors({**form.defaults(), "world_size": 0, "lr": -1.0})
    assert [f for f, _ in errs] == ["world_size", "lr"]
    assert "world_size must be >= 1 (got 0)" in errs[0][1]
    errs = form.validation_errors({**form.defaults(), "fault": "raise", "fault_rank": 5})
    assert errs[0][0] == "fault_rank" and "< world_size" in errs[0][1]


def test_pair_values_keep_config_but_mode_and_the_fsdp_fields():
    v = {**form.defaults(), "mode": "single", "steps": 7, "reshard_after_forward": False}
    kept = {k: x for k, x in v.items() if k not in ("reshard_after_forward", "fsdp_param_dtype",
                                                    "fsdp_reduce_dtype")}
    assert form.pair_values(v) == {**kept, "mode": "ddp"}
    assert form.validation_errors(form.pair_values(v)) == []


def test_every_preset_is_a_valid_config_that_changes_what_it_names():
    from ddpviz.engine.config import PRESETS

    base = form.defaults()
    assert set(PRESETS) == set(form.PRESET_NAMES) and PRESETS["default"] == {}
    for name, changes in PRESETS.items():
        assert form.validation_errors(form.defaults(name)) == [], name
        assert all(base[k] != v for k, v in changes.items()), name  # no entry repeats a default
