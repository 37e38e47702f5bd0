"""Which real runs can test the predictor (issue 20, item 2), worked by hand: the runs that fed
the fit and, when a single baseline set κ and f, single-device runs are in sample (DP and DDP at world
size 1 are tests: 2026-12-06); the error reported is only the other runs', with their count."""

import pytest

from ddpviz.engine.predict.validation import BASELINE, CALIBRATION, in_sample, out_of_sample, validate


def _m(run_id, mode, n, step_s):
    return dict(run_id=run_id, mode=mode, world_size=n, step_time_s=step_s, samples_per_s=96 / step_s)


PRED = [dict(mode=m, world_size=n, step_time_s=s, samples_per_s=96 / s)
        for m, n, s in (("dp", 1, 0.010), ("ddp", 1, 0.010), ("dp", 2, 0.008), ("ddp", 2, 0.006),
                        ("dp", 4, 0.009), ("ddp", 4, 0.004))]
MEASURED = [_m("fit-dp", "dp", 2, 0.008), _m("fit-ddp", "ddp", 2, 0.006), _m("ddp1", "ddp", 1, 0.010),
            _m("dp4", "dp", 4, 0.0075), _m("ddp4", "ddp", 4, 0.005)]


def test_fit_runs_and_single_device_runs_are_in_sample_not_dp_or_ddp_at_one_device():
    got = in_sample(MEASURED + [_m("single1", "single", 1, 0.010)], {"fit-dp", "fit-ddp", "fit-single"},
                    baseline_fitted=True)
    assert got == {"fit-dp": CALIBRATION, "fit-ddp": CALIBRATION, "single1": BASELINE}
    # without a baseline that set κ and f, world size 1 is a prediction like any other
    assert in_sample(MEASURED, {"fit-dp", "fit-ddp"}, baseline_fitted=False) == {
        "fit-dp": CALIBRATION, "fit-ddp": CALIBRATION}


def test_the_error_reported_is_the_out_of_sample_runs_only_with_their_count():
    rows = validate(PRED, MEASURED, in_sample(MEASURED, {"fit-dp", "fit-ddp"}, baseline_fitted=True))
    assert [(v["run_id"], v["in_fit"]) for v in rows] == [
        ("fit-dp", True), ("fit-ddp", True), ("ddp1", False), ("dp4", False), ("ddp4", False)]
    oos = out_of_sample(rows)
    # ddp1: predicted 10 ms vs 10 ms = 0%; dp4: predicted 9 ms vs 7.5 ms measured = +20%; ddp4: 4 ms vs 5 ms = -20%
    assert oos["runs"] == 3 and oos["in_fit"] == 2
    assert oos["step_time_error_pct"]["max_abs"] == pytest.approx(20.0)
    assert oos["step_time_error_pct"]["median_abs"] == pytest.approx(20.0)
    # samples/s: 0%; 96/9ms vs 96/7.5ms = -16.7%; 96/4ms vs 96/5ms = +25%
    assert oos["samples_per_s_error_pct"]["max_abs"] == pytest.approx(25.0)
    assert oos["samples_per_s_error_pct"]["median_abs"] == pytest.approx(100 / 6)


def test_only_fit_runs_leave_nothing_to_report():
    rows = validate(PRED, MEASURED[:2], in_sample(MEASURED[:2], {"fit-dp", "fit-ddp"}, True))
    oos = out_of_sample(rows)
    assert oos["runs"] == 0 and oos["in_fit"] == 2 and oos["step_time_error_pct"]["max_abs"] is None


def test_repeats_at_the_fits_world_size_are_counted_as_such_and_said():
    """A run outside the fit at the fit's world size (2 here) repeats it: its error is run-to-run noise. By
    hand: dp4 and ddp4 ran at 4 (scaling), a repeat "ddp2b" at 2."""
    from ddpviz.workers.scaleout_text import out_of_sample_line

    measured = MEASURED + [_m("ddp2b", "ddp", 2, 0.0066)]
    rows = validate(PRED, measured, in_sample(measured, {"fit-dp", "fit-ddp"}, baseline_fitted=True))
    oos = out_of_sample(rows, [2])
    assert oos["runs"] == 4 and oos["at_fit_world_sizes"] == 1  # ddp1, dp4, ddp4 and the repeat
    assert "; 1 of them at the fit's world size (repeats)" in out_of_sample_line(dict(out_of_sample=oos))
    only = out_of_sample([v for v in rows if v["run_id"] == "ddp2b"], [2])
    assert only["at_fit_world_sizes"] == 1 == only["runs"]
    assert "all at the fit's world size" in out_of_sample_line(dict(out_of_sample=only))
    assert out_of_sample(rows)["at_fit_world_sizes"] == 0  # sizes not given: nothing claimed
    line = out_of_sample_line(dict(out_of_sample=oos, validation_not_checked="link: needs a fit"))
    assert line == "predicted vs measured on this machine: not checked (link: needs a fit)"
