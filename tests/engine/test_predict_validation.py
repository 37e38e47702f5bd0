"""The scale-out predictor against real runs on this machine (CPU, gloo): calibrated on world
size 2 only (DP, DDP and the single baseline of that config), it must predict the median step
time of DP and DDP at world sizes 1 and 3 within `TOLERANCE`.

The seven runs are measured side by side in time: started at once, they train in turns of
`BLOCK_STEPS` steps, one run at a time, the order rotated each round (`engine.harness.interleaved`), so
the calibration runs and the runs checked see the same machine. Run one after another, the same
runs on this VM gave errors from −32% to +154% for one build (step times drift 30-60% over
seconds). Within each run the faster half of the steady steps is used (`measure_run`'s
`fastest_share`: a turn's first step after the wait is cold). Set DDPVIZ_PREDICT_JSON=path.json
to keep the figures (each run's split, and the errors without the contention term κ).
Seven tries on 2026-12-01 with κ: the largest error per try was 20%, 16%, 12%, 8%, 17%, 17%
and 14% (without κ, DDP at world size 1 came out 28-34% slow; docs/predict.md).
At world size 3 the 3 ranks share 2 cores (1 thread each) and at world size 1 a device has
both cores' threads (engine.components.training.cpu_threads_per_rank): the model's time-share rule and
its contention term are what is tested there.
"""

from __future__ import annotations

import json
import os

import pytest

from engine.config import RunConfig
from engine.harness.interleaved import run_in_turns
from engine.predict.inputs import measure_run
from engine.predict.scaleout import Scenario, contention, fixed_fraction, predict, validate

FASTEST = 0.5  # share of steady steps kept, the fastest
TOLERANCE = 0.25  # |predicted - measured| / measured, step time (the bar; aim: 0.10)
BLOCK_STEPS = 10
CONFIG = dict(model="mlp", width=256, depth=3, dataset="digits", global_batch_size=96, steps=150,
              bucket_cap_mb=0.1, step_delay_s=0.0, eval_every=0)
RUNS = [("dp", 2), ("ddp", 2), ("dp", 1), ("ddp", 1), ("dp", 3), ("ddp", 3), ("single", 2)]


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
def test_prediction_from_world_size_2_holds_at_1_and_3():
    cores, load_before = os.cpu_count() or 1, os.getloadavg()[0]
    got = run_in_turns({f"val-{m}-{n}": RunConfig(mode=m, world_size=n, **CONFIG) for m, n in RUNS}, BLOCK_STEPS)
    events = {(m, n): got[f"val-{m}-{n}"] for m, n in RUNS}
    single = measure_run(events.pop(("single", 2)), FASTEST)
    cal = {m: measure_run(events[(m, 2)], FASTEST) for m in ("dp", "ddp")}
    kappa, _ = contention(single, cal["ddp"])
    f, _ = fixed_fraction(single, cal["ddp"], kappa)
    rows = predict(cal, [1, 2, 3], Scenario(fixed_fraction=f, contention=kappa))
    measured, parts = [], {"single2": _parts(single)}
    for (m, n), evs in events.items():
        r = measure_run(evs, FASTEST)
        parts[f"{m}{n}"] = _parts(r)
        measured.append(dict(run_id=f"{m}{n}", mode=m, world_size=n, step_time_s=r.step_time_s,
                             samples_per_s=r.samples_per_s))
    checked = validate(rows, measured)
    # the same calibration without the contention term, kept in the JSON to compare (not judged)
    f1, _ = fixed_fraction(single, cal["ddp"])
    without = validate(predict(cal, [1, 2, 3], Scenario(fixed_fraction=f1)), measured)
    lines = [f"{v['mode']} n={v['world_size']}: measured {v['measured_step_time_s'] * 1e3:.3f} ms, "
             f"predicted {v['predicted_step_time_s'] * 1e3:.3f} ms ({v['step_time_error_pct']:+.1f}%)"
             for v in checked]
    print("\n".join([f"fixed fraction {f:.2f}, contention {kappa:.2f}", *lines]))
    if os.environ.get("DDPVIZ_PREDICT_JSON"):
        with open(os.environ["DDPVIZ_PREDICT_JSON"], "w") as fh:
            json.dump(dict(fixed_fraction=f, contention=kappa, validation=checked, parts=parts,
                           without_contention={f"{v['mode']}{v['world_size']}": round(v["step_time_error_pct"], 1)
                                               for v in without},
                           config=CONFIG, block_steps=BLOCK_STEPS,
                           cores=cores, load_before=load_before), fh, indent=2)
    assert len(checked) == 6
    # calibrated at n=2: reproduced there by construction (not a check); 1 and 3 are the check
    assert all(abs(v["step_time_error_pct"]) < 1e-6 for v in checked if v["world_size"] == 2)
    off = [line for v, line in zip(checked, lines) if abs(v["step_time_error_pct"]) > 100 * TOLERANCE]
    assert not off, "beyond the tolerance:\n" + "\n".join(off)
