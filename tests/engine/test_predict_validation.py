"""The scale-out predictor against real runs on this machine (CPU, gloo), out of sample: fitted
on world size 2 only (DP, DDP and the single baseline of that config), it is judged only on runs
that fed nothing into the fit — DP and DDP at world size 3 — whose median step time it must
predict within `TOLERANCE`. The fitted runs and world size 1 (the single baseline's own
computation, which set κ and f) are not checked: the model reproduces them by construction
(`engine.predict.validation.in_sample`).

The seven runs are measured side by side in time: started at once, they train in turns of
`BLOCK_STEPS` steps, one run at a time, the order rotated each round (`engine.harness.interleaved`), so
the calibration runs and the runs checked see the same machine. Run one after another, the same
runs on this VM gave errors from −32% to +154% for one build (step times drift 30-60% over
seconds). Within each run the faster half of the steady steps is used (`measure_run`'s
`fastest_share`: a turn's first step after the wait is cold). Set DDPVIZ_PREDICT_JSON=path.json
to keep the figures (each run's split, and the errors without the contention term κ).
Earlier tries (2026-12-01) judged world sizes 1 and 3 together, 1 in sample; the out-of-sample
figures are in docs/predict.md. At world size 3 the 3 ranks share 2 cores (1 thread each)
(engine.components.training.cpu_threads_per_rank): the model's time-share rule and its contention
term are what is tested there.
"""

from __future__ import annotations

import json
import os

import pytest

from ddpviz.engine.config import RunConfig
from ddpviz.engine.harness.interleaved import run_in_turns
from ddpviz.engine.predict.inputs import measure_run
from ddpviz.engine.predict.scaleout import Scenario, contention, fixed_fraction, predict, validate

FASTEST = 0.5  # share of steady steps kept, the fastest
TOLERANCE = 0.25  # |predicted - measured| / measured, step time (the bar; aim: 0.10)
BLOCK_STEPS = 10
CONFIG = dict(model="mlp", width=256, depth=3, dataset="digits", global_batch_size=96, steps=150,
              bucket_cap_mb=0.1, step_delay_s=0.0, eval_every=0)
FIT = [("dp", 2), ("ddp", 2), ("single", 2)]  # the runs the model is fitted on
CHECKED = [("dp", 3), ("ddp", 3)]  # the runs it is judged on: none fed the fit
RUNS = FIT + CHECKED


def _parts(r) -> dict[str, float]:
    """The medians a run gave (ms), kept in the JSON to see which part an error came from."""
    return {k: round(getattr(r, k) * 1e3, 4) for k in ("step_time_s", "forward_s", "backward_s",
                                                        "comm_exposed_s", "optimizer_s", "other_s")}


@pytest.mark.slow
@pytest.mark.timing
@pytest.mark.skipif(not os.environ.get("DDPVIZ_TIMING"),
                    reason="compares measured step times: a benchmark, run with DDPVIZ_TIMING=1 "
                           "(about 50 s; 7 of 7 tries within 25% on 2026-12-01, docs/predict.md)")
@pytest.mark.timeout(900)
def test_prediction_fitted_at_world_size_2_holds_out_of_sample_at_3():
    from ddpviz.engine.predict.validation import in_sample, out_of_sample

    cores, load_before = os.cpu_count() or 1, os.getloadavg()[0]
    got = run_in_turns({f"val-{m}-{n}": RunConfig(mode=m, world_size=n, **CONFIG) for m, n in RUNS}, BLOCK_STEPS)
    fit = {m: measure_run(got[f"val-{m}-{n}"], FASTEST) for m, n in FIT}
    single, cal = fit.pop("single"), fit
    kappa, _ = contention(single, cal["ddp"])
    f, _ = fixed_fraction(single, cal["ddp"], kappa)
    rows = predict(cal, [3], Scenario(fixed_fraction=f, contention=kappa))
    measured, parts = [], {"single2": _parts(single)}
    for m, n in CHECKED:  # measured apart from the fit: these events never reached it
        r = measure_run(got[f"val-{m}-{n}"], FASTEST)
        parts[f"{m}{n}"] = _parts(r)
        measured.append(dict(run_id=f"val-{m}-{n}", mode=m, world_size=n, step_time_s=r.step_time_s,
                             samples_per_s=r.samples_per_s))
    fit_ids = {f"val-{m}-{n}" for m, n in FIT}
    assert not fit_ids & {v["run_id"] for v in measured}
    assert in_sample(measured, fit_ids, baseline_fitted=True) == {}  # the library agrees: all out of sample
    checked = validate(rows, measured)
    oos = out_of_sample(checked)
    # the same calibration without the contention term, kept in the JSON to compare (not judged)
    f1, _ = fixed_fraction(single, cal["ddp"])
    without = validate(predict(cal, [3], Scenario(fixed_fraction=f1)), measured)
    lines = [f"{v['mode']} n={v['world_size']}: measured {v['measured_step_time_s'] * 1e3:.3f} ms, "
             f"predicted {v['predicted_step_time_s'] * 1e3:.3f} ms ({v['step_time_error_pct']:+.1f}%)"
             for v in checked]
    print("\n".join([f"fixed fraction {f:.2f}, contention {kappa:.2f}; out of sample: {oos}", *lines]))
    if os.environ.get("DDPVIZ_PREDICT_JSON"):
        with open(os.environ["DDPVIZ_PREDICT_JSON"], "w") as fh:
            json.dump(dict(fixed_fraction=f, contention=kappa, validation=checked, out_of_sample=oos,
                           parts=parts,
                           without_contention={f"{v['mode']}{v['world_size']}": round(v["step_time_error_pct"], 1)
                                               for v in without},
                           config=CONFIG, block_steps=BLOCK_STEPS,
                           cores=cores, load_before=load_before), fh, indent=2)
    assert len(checked) == len(CHECKED) and oos["runs"] == len(CHECKED)
    off = [line for v, line in zip(checked, lines) if abs(v["step_time_error_pct"]) > 100 * TOLERANCE]
    assert not off, "beyond the tolerance:\n" + "\n".join(off)
