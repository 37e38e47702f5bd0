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


def test_a_cuda_side_says_done_only_after_its_gpu_work_and_its_block_time_counts_it(monkeypatch):
    """CPU twin of the GPU harness (issue 31): a stand-in torch whose CUDA is initialised counts its
    synchronize calls; a block's 'done' must follow one (else the side's queued GPU work would run in the
    other side's turn), and the block's step time is its wall per step from the controller's log
    (hand-worked: released at 10.0, done at 10.5, 5 steps -> 0.1 s a step)."""
    import threading
    import types

    from ddpviz.engine.harness.overhead import block_walls
    from ddpviz.engine.measure import turns
    from ddpviz.engine.measure.turns import TurnController, TurnGate

    calls = []  # the gate's synchronize calls and what it sends, in order
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: True,
                                                            synchronize=lambda: calls.append("sync")))
    ctl = TurnController({"a": 1}, block_steps=2, timeout_s=20)
    seen = []

    def side():
        gate = TurnGate(ctl.spec, "a", 0)
        send = gate.conn.send
        gate.conn.send = lambda msg: (calls.append(msg), send(msg))
        for step in range(4):
            gate.at_step(step)
            seen.append(("step", step, len(calls)))
        gate.at_end()

    monkeypatch.setattr(turns, "loaded_torch", lambda: fake)  # not sys.modules: other threads may import torch
    t = threading.Thread(target=side, daemon=True)
    t.start()
    ctl.run(["a", "a"], alive=lambda: True)
    t.join(10)
    assert calls == ["sync", "done", "sync", "done"]  # each block's GPU work waited for before it says done
    assert [n for _, step, n in seen] == [0, 0, 2, 2]
    assert block_walls([("a", 10.0, 10.5), ("b", 10.5, 11.0), ("a", 11.0, 11.2)], "a", 5) == \
        pytest.approx([0.1, 0.04])
