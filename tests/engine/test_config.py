"""RunConfig validation: every refusal names the field and the rule."""

import pytest

from ddpviz.engine.config import ConfigError, RunConfig, validate_config


def refused(**fields) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        validate_config(fields)
    return dict(info.value.errors)


def test_defaults_are_valid_and_describe_a_ddp_pair_run():
    cfg = validate_config({})
    assert (cfg.mode, cfg.world_size, cfg.model, cfg.dataset, cfg.bucket_cap_mb) == ("ddp", 2, "mlp", "digits", 25.0)
    assert cfg.micro_batch_per_device == 128  # global batch 256 over 2 devices


@pytest.mark.parametrize("fields, field, words", [
    ({"world_size": 0}, "world_size", "must be >= 1"),
    ({"bucket_cap_mb": 0}, "bucket_cap_mb", "must be > 0"),
    ({"bucket_cap_mb": -5}, "bucket_cap_mb", "must be > 0"),
    ({"mode": "zero3"}, "mode", "must be one of"),
    ({"global_batch_size": 3, "world_size": 4}, "global_batch_size", "must be >= world_size (4)"),
    ({"global_batch_size": 10, "world_size": 3}, "global_batch_size", "[4, 4, 2]"),
    ({"model": "gpt", "dataset": "digits"}, "dataset", "does not fit model 'gpt'"),
    ({"model": "gpt", "dataset": "text", "width": 30, "n_head": 4}, "n_head", "divisible by n_head"),
    ({"warp_speed": True}, "warp_speed", "is not a known field"),
    ({"fault": "hang", "mode": "dp"}, "fault", "needs mode 'ddp'"),
    ({"fault": "raise", "fault_rank": 2, "world_size": 2}, "fault_rank", "must be < world_size"),
    ({"steps": "many"}, "steps", "steps"),
])
def test_refusals_name_the_field_and_rule(fields, field, words):
    errors = refused(**fields)
    assert field in errors, errors
    assert words in errors[field]


def test_unknown_model_is_refused_with_the_known_names():
    errors = refused(model="resnet9000")
    assert "mlp" in errors["model"] and "resnet9000" in errors["model"]


def test_several_errors_are_all_reported():
    errors = refused(world_size=0, lr=-1)
    assert set(errors) == {"world_size", "lr"}


def test_config_round_trips_through_json():
    cfg = RunConfig(mode="dp", world_size=4, global_batch_size=128)
    assert validate_config(cfg.to_json_dict()) == cfg


def test_non_object_payload_is_refused():
    with pytest.raises(ConfigError, match="JSON object"):
        validate_config(["mode", "ddp"])  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_number_that_is_not_finite_is_refused_as_such(bad):
    """`--lr nan` was refused with "lr must be <= 10.0 (got nan)" (a new user, 2026-12-06): true of no NaN."""
    with pytest.raises(ConfigError) as refused:
        validate_config({"lr": bad, "bucket_cap_mb": bad})
    assert dict(refused.value.errors) == {"lr": f"lr must be a finite number (got {bad!r})",
                                          "bucket_cap_mb": f"bucket_cap_mb must be a finite number (got {bad!r})"}


def test_a_dp_failure_names_its_device_not_a_rank():
    """DP's injected fault read "rank 0 raised at step 5" and "Run failed (rank 0 at step 5)" (a new user,
    2026-12-06): DP has one process with a thread per device."""
    from ddpviz.engine.components.faults import InjectedFault, maybe_fail
    from ddpviz.engine.stages import where_failed

    error = {"stage": "training", "rank": 0, "step": 5}
    assert (where_failed(error, "dp"), where_failed(error, "ddp"), where_failed(error)) == \
        ("device 0 at step 5", "rank 0 at step 5", "rank 0 at step 5")
    for mode, word in (("dp", "device"), ("ddp", "rank")):
        with pytest.raises(InjectedFault, match=f"^injected fault: {word} 0 raised at step 5$"):
            maybe_fail(RunConfig(mode=mode, fault="raise", fault_rank=0, fault_step=5), 0, 5)
