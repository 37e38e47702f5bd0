"""`ddpviz compare --turns N` (engine.harness.compare.in_turns): DP and DDP measured at the same
moments of the machine, taking turns of N steps, instead of one after the other.

The reference for "taking turns" is the events' own clock: each step event's `start_ts` (unix
seconds, taken inside the step) says when it ran, independent of the harness's schedule. A pair
run one after the other has all of DP's blocks before DDP's; in turns, the owners of the blocks
sorted by time alternate in `rotated_order`'s pattern.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddpviz.engine.config import RunConfig
from ddpviz.engine.events import ListSink
from ddpviz.engine.harness.compare import compare

CFG = dict(model="mlp", dataset="digits", width=16, depth=2, global_batch_size=32, steps=8, world_size=2,
           step_delay_s=0.0, eval_every=0, probe=False)


def _blocks(events: list[dict], block: int) -> list[tuple[float, float]]:
    """(first step's start, last step's end) of each block of one run, from rank 0's step events."""
    steps = sorted((e for e in events if e["type"] == "step" and e.get("rank", 0) == 0), key=lambda e: e["step"])
    spans = [(e["start_ts"], e["start_ts"] + e["step_time_s"]) for e in steps]
    return [(spans[i][0], spans[i + block - 1][1]) for i in range(0, len(spans), block)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dp_and_ddp_take_turns_and_both_are_reported():
    sinks = {m: ListSink() for m in ("dp", "ddp")}
    report = compare(RunConfig(**CFG), modes=("dp", "ddp"), turns=2, sink_for=sinks.__getitem__)
    for mode in ("dp", "ddp"):
        r = report[mode]
        assert r["status"] == "succeeded" and r["samples_per_s"] > 0, r
        assert r["max_param_diff_vs_single"] is None  # the runs' parameters stay in their processes
        assert len([e for e in sinks[mode].events if e["type"] == "step" and e.get("rank", 0) == 0]) == 8
    owned = sorted([(b, m) for m in ("dp", "ddp") for b in _blocks(sinks[m].events, 2)])
    # the blocks never overlap in time, and they alternate as rotated_order says (dp ddp, ddp dp, ...)
    assert all(a[0][1] <= b[0][0] for a, b in zip(owned, owned[1:])), owned
    assert [m for _, m in owned] == ["dp", "ddp", "ddp", "dp", "dp", "ddp", "ddp", "dp"], owned


def test_turns_that_do_not_divide_the_steps_are_refused_before_anything_runs():
    out = subprocess.run([sys.executable, "-m", "ddpviz.workers", "compare", "--modes", "dp,ddp", "--steps", "8",
                          "--turns", "3"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "--turns must be auto, 0, or an integer >= 2 dividing --steps (8) (got 3)" in out.stderr
    assert "running" not in out.stderr  # nothing started


@pytest.mark.parametrize("given, modes, steps, turns, said", [
    ("auto", ("dp", "ddp"), 300, 10, "dp, ddp at once, in turns of 10 steps (30 turns each)"),
    ("auto", ("dp", "ddp"), 12, 6, "in turns of 6 steps (2 turns each)"),
    ("auto", ("single", "dp", "ddp"), 300, None, "'single' is among --modes"),
    ("auto", ("dp", "ddp"), 7, None, "no turn of 2-20 steps divides steps=7"),
    ("0", ("dp", "ddp"), 300, None, "one mode after another (--turns 0)"),
    ("4", ("dp", "ddp"), 8, 4, "in turns of 4 steps"),
    ("3", ("dp", "ddp"), 8, "bad", "--turns must be auto, 0, or an integer >= 2 dividing --steps (8) (got 3)"),
    ("1", ("dp", "ddp"), 8, "bad", "(got 1)"),
    ("ten", ("dp", "ddp"), 8, "bad", "(got ten)"),
])
def test_turns_auto_takes_the_apps_turn_size_unless_single_runs(given, modes, steps, turns, said):
    from ddpviz.workers.cli.local import compare_turns

    got, why = compare_turns(given, modes, steps)
    assert got == turns and said in why
