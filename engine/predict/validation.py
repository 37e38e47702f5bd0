"""The scale-out predictor against real runs: its error per run, and which runs can test it.

A prediction is tested only by a run that fed nothing into the fit. The runs whose inputs
calibrated the model come back at their own world size by construction, and a single-device run
reproduces the single-device baseline that set κ and f (`engine.predict.calibrate`), so
`in_sample` names those, `validate` marks them, and `out_of_sample` reports the error of the rest
with their count. Pure Python (no torch).
"""

from __future__ import annotations

from typing import Any

CALIBRATION = "calibration: this run set the model's inputs"
BASELINE = ("a single-device run: the model's one-device step is the single-device baseline's that set its "
            "κ and f, so it comes back by construction")


def in_sample(measured: list[dict[str, Any]], fit_run_ids: set[str],
              baseline_fitted: bool) -> dict[str, str]:
    """{run_id: why its error is no test of the model} for the measured runs that fed the fit.

    A run is in sample when it is one of the runs whose inputs calibrated the model
    (`fit_run_ids`: `CALIBRATION`, reproduced at its own world size by construction), or when it is
    a single-device run (mode single) and a single-device baseline set κ and f (`baseline_fitted`): the
    model's one-device step is then that baseline's (`BASELINE`). DP and DDP at world size 1 are tests
    like any other: the model says they cost what single does, and a DP x1 run 39% slower than it was
    listed as "in the fit ... by construction" at +63% (a new user, 2026-12-06). Every other run fed
    nothing into the fit.
    """
    out = {}
    for m in measured:
        if m["run_id"] in fit_run_ids:
            out[m["run_id"]] = CALIBRATION
        elif baseline_fitted and m["world_size"] == 1 and m.get("mode") == "single":
            out[m["run_id"]] = BASELINE
    return out


def validate(predicted: list[dict[str, Any]], measured: list[dict[str, Any]],
             in_fit: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Predicted against measured, per measured run.

    Args:
        predicted: `predict` rows.
        measured: ``{run_id, mode, world_size, step_time_s, samples_per_s}`` per real run.
        in_fit: `in_sample`'s {run_id: why} of the runs that fed the fit.

    Returns:
        ``{run_id, mode, world_size, measured_step_time_s, predicted_step_time_s,
        step_time_error_pct, measured_samples_per_s, predicted_samples_per_s,
        samples_per_s_error_pct, in_fit, in_fit_reason}`` with error = (predicted − measured) /
        measured · 100; `in_fit` True (and its reason) for a run whose error is no test.
    """
    in_fit = in_fit or {}
    by = {(p["mode"], p["world_size"]): p for p in predicted}
    out = []
    for m in measured:
        p = by.get((m["mode"], m["world_size"]))
        if p is None or not m.get("step_time_s") or not m.get("samples_per_s"):
            continue
        out.append(dict(run_id=m["run_id"], mode=m["mode"], world_size=m["world_size"],
                        measured_step_time_s=m["step_time_s"], predicted_step_time_s=p["step_time_s"],
                        step_time_error_pct=100 * (p["step_time_s"] - m["step_time_s"]) / m["step_time_s"],
                        measured_samples_per_s=m["samples_per_s"], predicted_samples_per_s=p["samples_per_s"],
                        samples_per_s_error_pct=100 * (p["samples_per_s"] - m["samples_per_s"]) / m["samples_per_s"],
                        in_fit=m["run_id"] in in_fit, in_fit_reason=in_fit.get(m["run_id"])))
    return out


def out_of_sample(validation: list[dict[str, Any]], fit_world_sizes: list[int] | None = None) -> dict[str, Any]:
    """The model's error on the runs that fed nothing into the fit (`validate` rows, `in_fit`
    false): ``{runs, step_time_error_pct: {median_abs, max_abs}, samples_per_s_error_pct:
    {median_abs, max_abs}}`` (percent; None without such runs), `in_fit` (how many rows were
    left out), and `at_fit_world_sizes`: how many of those runs ran at a world size the fit's runs had
    (`fit_world_sizes`): a repeat at the fitted size tests run-to-run noise, not the scaling."""
    rows = [v for v in validation if not v.get("in_fit")]

    def spread(key: str) -> dict[str, float | None]:
        errs = sorted(abs(v[key]) for v in rows)
        if not errs:
            return dict(median_abs=None, max_abs=None)
        mid = len(errs) // 2
        median = errs[mid] if len(errs) % 2 else (errs[mid - 1] + errs[mid]) / 2
        return dict(median_abs=median, max_abs=errs[-1])

    return dict(runs=len(rows), in_fit=len(validation) - len(rows),
                at_fit_world_sizes=sum(v["world_size"] in (fit_world_sizes or []) for v in rows),
                step_time_error_pct=spread("step_time_error_pct"),
                samples_per_s_error_pct=spread("samples_per_s_error_pct"))
