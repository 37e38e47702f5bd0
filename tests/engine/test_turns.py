"""Runs taking turns (engine.measure.turns, engine.harness.interleaved): the order, and a failing run ending the
whole measurement with its own error instead of a hang at the gate."""

import os
import time

import psutil
import pytest

from ddpviz.engine.config import RunConfig
from ddpviz.engine.harness.interleaved import rotated_order, run_in_turns


def test_rotated_order_starts_each_round_one_run_later():
    assert rotated_order(["a", "b", "c"], 3) == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_run_in_turns_refuses_steps_that_are_not_whole_blocks():
    with pytest.raises(ValueError, match="multiple of block_steps=4"):
        run_in_turns({"a": RunConfig(mode="single", steps=6), "b": RunConfig(mode="single", steps=8)}, 4)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_that_fails_mid_turns_ends_all_with_its_error_and_leaves_no_process():
    """The DP run raises at step 5 (its second turn): the single run waiting at the gate fails too
    (EOF), the error names the DP run and its fault, and no child process is left."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    cfgs = {"ok-single": RunConfig(mode="single", world_size=2, steps=8, step_delay_s=0.0, eval_every=0),
            "bad-dp": RunConfig(mode="dp", world_size=2, steps=8, step_delay_s=0.0, eval_every=0,
                                fault="raise", fault_rank=0, fault_step=5)}
    with pytest.raises(RuntimeError, match="run bad-dp failed: .*injected fault"):
        run_in_turns(cfgs, 4, timeout_s=120)
    deadline = time.time() + 30
    left = []
    while time.time() < deadline:
        left = [p for p in psutil.Process().children(recursive=True)
                if p.pid not in before and p.is_running() and p.status() != psutil.STATUS_ZOMBIE
                and not (p.ppid() == os.getpid() and any(  # multiprocessing's own helpers, not ranks
                    k in " ".join(p.cmdline()) for k in ("resource_tracker", "multiprocessing.forkserver")))]  # multiprocessing's own, lives with us
        if not left:
            break
        time.sleep(0.5)
    assert not left, f"processes left: {[p.cmdline()[:3] for p in left]}"
