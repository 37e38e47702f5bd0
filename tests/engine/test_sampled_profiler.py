"""ddpviz's sampled-step profiler (`engine.modes.ddp.sampled`) beside a script's own PyTorch profiler.

A process has one profiler. The references are the script's own profiler results: its events must all be
there, and a scheduled profiler whose warm-up ddpviz's sampled steps fall into must not crash the process
(without the guard it lost every event, or died of SIGSEGV at its next record: torch 2.13, 2026-12-06).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch

from ddpviz.engine.modes.ddp.sampled import SCRIPT_PROFILER, SampledSpans


def test_a_script_profiler_that_is_recording_keeps_its_events_and_ddpviz_profiles_nothing():
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Linear(4, 4)
    with profile(activities=[ProfilerActivity.CPU]) as script:
        ours = SampledSpans()
        ours.start()
        model(torch.randn(2, 4)).sum().backward()
        assert not ours.active and ours.stood_aside == SCRIPT_PROFILER
    names = {e.name for e in script.events()}
    assert "aten::addmm" in names and "autograd::engine::evaluate_function: AddmmBackward0" in names
    again = SampledSpans()  # no profiler on (and no watch in this process): ddpviz profiles
    again.start()
    model(torch.randn(2, 4)).sum().backward()
    assert again.active and again.stood_aside is None
    assert again.spans() is None  # no DDP here: no all-reduce to pair, nothing claimed


SCHEDULED = textwrap.dedent("""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule
    from ddpviz.engine.modes.ddp.sampled import SampledSpans, watch_script_profiler

    assert watch_script_profiler() and watch_script_profiler()  # idempotent
    model = torch.nn.Linear(4, 4)
    ready = []
    ours = SampledSpans()
    ours.start()  # before the script's profiler: ddpviz may profile
    model(torch.randn(2, 4)).sum().backward()
    print("before", ours.active, ours.spans())
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=2, active=2),
                 on_trace_ready=lambda p: ready.append(len(p.events()))) as script:
        for step in range(4):
            ours = SampledSpans()
            ours.start()  # ddpviz's sampled steps 0-2 fall in the script's warm-up (0, 1) and record (2)
            model(torch.randn(2, 4)).sum().backward()
            print("step", step, script.current_action.name, ours.active, ours.stood_aside is not None)
            script.step()
    ours = SampledSpans()
    ours.start()  # after it: ddpviz stays aside for good
    print("after", ours.active)
    print("events", ready)
""")


def test_a_scheduled_script_profiler_survives_sampled_steps_in_its_warm_up():
    proc = subprocess.run([sys.executable, "-c", SCHEDULED], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])  # -11 without the guard (SIGSEGV)
    lines = [line for line in proc.stdout.splitlines() if not line.startswith("USDT")]
    assert lines[0] == "before True None"
    assert lines[1:5] == [f"step {i} {a} False True" for i, a in
                          enumerate(("WARMUP", "WARMUP", "RECORD", "RECORD_AND_SAVE"))]
    assert lines[5] == "after False"
    events = eval(lines[6].removeprefix("events "))  # noqa: S307  (a list of ints we printed)
    assert len(events) == 1 and events[0] >= 2 * 4  # the two recorded steps' forward and backward ops at least


def test_a_second_ddps_sampled_step_is_told_ddpvizs_own_profile_is_running_not_the_scripts():
    """Two DDPs of one process (`--bucket-timing recorder`) sampled in one backward: the second found the first's
    profile running and said "the script runs PyTorch's profiler itself" of a script that runs none (a new user's
    GAN, 2026-12-06). PyTorch's own flag is the reference that a profile is on."""
    import pytest

    from ddpviz.engine.modes.ddp.sampled import OTHER_DDP, profiler_busy

    if profiler_busy() is not None:
        pytest.skip(f"a profiler is busy in this process already: {profiler_busy()}")
    first, second = SampledSpans(), SampledSpans()
    first.start()
    try:
        assert torch._C._autograd._profiler_enabled()
        second.start()
        assert second.stood_aside == OTHER_DDP and not second.active
    finally:
        first.stop()
    assert not torch._C._autograd._profiler_enabled() and profiler_busy() is None
