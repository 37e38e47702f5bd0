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


def _report(best):
    trial = dict(knobs={"bucket_cap_mb": 4.0}, predicted_ratio=0.9, ratio=0.8, interval=[0.75, 0.85],
                 verdict="faster", loss_max_abs_diff=0.0, note="same math: losses within 1e-05 of the baseline's")
    failed = dict(knobs={"static_graph": True}, predicted_ratio=1.0, ratio=None, interval=None, verdict="not measured",
                  loss_max_abs_diff=None, note="the trial failed: rank 1: RuntimeError: boom")
    return dict(steps=30, warmup=5, rounds=3, skipped=[], trials=[trial, failed],
                baseline=dict(world_size=2, step_time_s=0.02, bucket_bytes=[100], settings={}),
                prediction_error=dict(count=1, median_abs=0.125, worst=0.125), best=best,
                answer="best: ..." if best else "none beat the baseline beyond noise")


def test_the_terminal_answer(capsys):
    from ddpviz.workers.cli.tune_report import print_report

    print_report(_report(dict(paste=["DistributedDataParallel(model, ..., bucket_cap_mb=4.0)"])))
    out = capsys.readouterr().out
    assert "0.750-0.850" in out and "median |error| 12.5%, worst +12.5%" in out
    assert "static_graph=True: the trial failed: rank 1: RuntimeError: boom" in out
    assert out.rstrip().endswith("DistributedDataParallel(model, ..., bucket_cap_mb=4.0)")
    print_report(_report(None))
    assert "none beat the baseline beyond noise" in capsys.readouterr().out


def test_the_baseline_line_says_buckets_and_settings_in_words(capsys):
    """A new user read "buckets [16793600] bytes, script's settings {'bucket_cap_mb': 25.0, ...}" (2026-12-06)."""
    from ddpviz.workers.cli.tune_report import buckets_text, print_report

    rep = _report(None)
    rep["baseline"].update(bucket_bytes=[16793600], settings={"bucket_cap_mb": 25.0, "static_graph": False})
    print_report(rep)
    first = capsys.readouterr().out.splitlines()[0]
    assert first == ("baseline: 2 ranks, step 20.000 ms (median of steady steps 5..29), 1 bucket of 16.0 MiB; "
                     "the script's settings: bucket_cap_mb=25.0, static_graph=False")
    mib = 2**20
    assert buckets_text([25 * mib, 25 * mib, 2 * mib]) == "3 buckets (25.0 MiB, 25.0 MiB, 2.00 MiB)"
    assert buckets_text([mib] * 7 + [1024]) == "8 buckets, 7.00 MiB in all (1.00 KiB to 1.00 MiB)"
    assert buckets_text([]) == "no bucket recorded"
    # a script that ends by itself before the 30 steps asked: the steps the trials had, and why its files were
    # written by every trial (a new user read "5..29" for trials of 24 steps, 2026-12-06)
    rep["baseline"]["steps_recorded"] = 24
    print_report(rep)
    first = capsys.readouterr().out.splitlines()[0]
    assert "(median of steady steps 5..23: the script ends by itself after 24 of the 30 steps asked, so every " \
           "trial ran it to its end, writing what it writes)" in first


def test_the_budget_line_says_what_it_fits():
    from ddpviz.workers.cli.tune_report import plan_text

    assert plan_text(4, 3, 4) == "4 candidate settings; the budget fits 3 rounds of the baseline against each of them"
    assert plan_text(4, 2, 1) == "4 candidate settings; the budget fits 2 rounds of the baseline against the 1 predicted fastest"
    assert plan_text(1, 1, 1) == "1 candidate setting; the budget fits 1 round of the baseline against it"
    assert plan_text(2, 3, 2).endswith("against both of them") and plan_text(0, 0, 0) == "no candidate setting to try"


def test_a_trial_stopped_at_its_time_limit_says_how_far_it_got_and_why_nothing_reported(tmp_path):
    from ddpviz.workers.cli.tune import _ending

    limit = "stopped by tune after 60 s (the trial's time limit within --budget)"
    ended, err = _ending(-9, limit, dict(steps=3, stopped=None, ddp=None), 20, tmp_path, tmp_path / "err")
    assert ended == limit and err["exception"] == "3 of the 20 step(s) it needed were recorded"
    _, err = _ending(-9, limit, dict(steps=0, stopped=None, ddp=None), 20, tmp_path, tmp_path / "err")
    assert err["exception"].startswith("0 of the 20 step(s)") and "env PYTHONPATH=" in err["exception"]
