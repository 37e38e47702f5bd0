"""`ddpviz tune`'s flags: refused settings name the flag and the rule (exit 2), and `--try`
settings parse to the knobs DDP gets (issue 35). No trial runs here."""

from __future__ import annotations

import pytest

from ddpviz.engine.tune import MIB, asked
from ddpviz.workers.cli.commands import build_parser
from ddpviz.workers.cli.exits import EXIT_REFUSED
from ddpviz.workers.cli.tune import parse_try


def test_try_parses_to_the_knobs():
    assert parse_try("bucket_cap_mb=4, gradient_as_bucket_view=true") == {
        "bucket_cap_mb": 4.0, "gradient_as_bucket_view": True}
    assert parse_try("comm_hook=fp16") == {"comm_hook": "fp16"}
    assert asked(dict(param_nbytes=[MIB] * 6), {"bucket_cap_mb": 2.0})["layout_bytes"] == [2 * MIB] * 3


@pytest.mark.parametrize("text, message", [
    ("bucket_cap_mb", "'bucket_cap_mb' is not KEY=VALUE"),
    ("bucket_cap_mb=big", "bucket_cap_mb must be a number of MiB"),
    ("bucket_cap_mb=0", "bucket_cap_mb must be > 0"),
    ("static_graph=1", "static_graph must be bool"),
    ("find_unused_parameters=true", "'find_unused_parameters' is not a knob tune sets"),
    ("comm_hook=int8", "comm_hook must be one of fp16, bf16, powersgd")])
def test_try_refuses_what_it_cannot_set(text, message):
    with pytest.raises(ValueError, match=message):
        parse_try(text)


@pytest.mark.parametrize("argv, message", [
    ([], "give the command to tune after `--`"),
    (["--steps", "6", "--", "x"], "--steps must be >= --warmup + 3 = 8 (got 6)"),
    (["--warmup", "1", "--", "x"], "--warmup must be >= 2"),
    (["--budget", "0", "--", "x"], "--budget must be > 0 seconds"),
    (["--rounds", "0", "--", "x"], "--rounds must be >= 1"),
    (["--knobs", "bucket_cap_mb,zero3", "--", "x"], "--knobs: zero3 not known"),
    (["--try", "static_graph=yes", "--", "x"], "--try: static_graph must be bool")])
def test_refused_flags_name_the_rule(argv, message, capsys):
    args = build_parser().parse_args(["tune", *argv])
    assert args.handler(args) == EXIT_REFUSED
    assert f"ddpviz tune: refused: {message}" in capsys.readouterr().err
