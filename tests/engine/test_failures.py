"""A failing, killed, hanging or canceled rank ends the run in an explained state, no process left."""

import os
import time

import psutil
import pytest

from ddpviz.engine.config import RunConfig
from ddpviz.engine.events import ListSink
from ddpviz.engine.run import run_training

pytestmark = pytest.mark.slow
BASE = dict(mode="ddp", width=32, depth=2, global_batch_size=32, steps=40, eval_every=0, step_delay_s=0)
BEFORE: set[int] = set()


@pytest.fixture(autouse=True)
def _baseline():
    """Children that existed before the test (e.g. a session's embedded Redis) are not the run's."""
    BEFORE.clear()
    BEFORE.update(p.pid for p in psutil.Process().children(recursive=True))


# multiprocessing's own helpers, which live as long as this process: the resource tracker and the
# rank fork server (engine.modes.ranks; its ranks are what must be gone)
_OWN = ("resource_tracker", "multiprocessing.forkserver")


def _own_helper(p: psutil.Process) -> bool:
    """A direct child running one of `_OWN` (ranks forked from the fork server share its command
    line, but are its children, not ours)."""
    return p.ppid() == os.getpid() and any(k in " ".join(p.cmdline()) for k in _OWN)


def children_alive():
    """Processes this test module started (directly or not) that are still running."""
    alive = []
    for p in psutil.Process().children(recursive=True):
        try:
            if (p.pid not in BEFORE and p.status() != psutil.STATUS_ZOMBIE
                    and not _own_helper(p)):
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def run(**fields):
    sink = ListSink()
    t0 = time.monotonic()
    result = run_training(RunConfig(**{**BASE, **fields}), sink, "f")
    return result, sink, time.monotonic() - t0


def test_a_rank_that_raises_fails_the_run_with_its_traceback():
    result, sink, _ = run(fault="raise", fault_rank=1, fault_step=3)
    assert result.status == "failed"
    assert result.error["rank"] == 1
    assert "rank 1 raised at step 3" in result.error["exception"]
    assert "maybe_fail" in result.error["traceback"]
    assert sink.events[-1]["type"] == "run_finished" and sink.events[-1]["status"] == "failed"
    assert not children_alive()


def test_a_killed_rank_is_named_with_its_signal():
    result, _, _ = run(fault="kill", fault_rank=0, fault_step=2)
    assert result.status == "failed"
    assert "SIGKILL" in result.error["exception"] and result.error["rank"] == 0
    assert not children_alive()


def test_a_hanging_rank_ends_by_collective_timeout_naming_the_stalled_rank():
    result, _, elapsed = run(fault="hang", fault_rank=1, fault_step=2, collective_timeout_s=3)
    assert result.status == "failed"
    assert "timed out in a collective at step 2; rank(s) [1] raised no error" in result.error["exception"]
    assert elapsed < 60
    assert not children_alive()


@pytest.mark.usefixtures("field_plugins")
def test_ranks_stuck_outside_any_collective_are_stopped_as_stalled_not_left_to_hang():
    """Every rank's forward stops returning at step 3 (field_models.HangsAt4): no collective waits, so no
    collective timeout fires; the launcher sees no step for 10 collective timeouts, stops every rank and
    fails the run saying so."""
    result, sink, elapsed = run(model="hangat4", collective_timeout_s=1, dataset="digits")
    assert result.status == "failed", result.error
    assert result.error["exception"].startswith("stalled: no rank reported a step for 1")
    assert "after step 2 (10 x collective_timeout_s=1 s, and 10 x the longest wait between two steps" in \
        result.error["exception"]
    assert result.error["step"] == 3
    assert max(e["step"] for e in sink.events if e["type"] == "step") == 2
    assert elapsed < 60
    assert not children_alive()


def test_the_stall_rule_allows_ten_times_the_longest_wait_between_steps_and_ends_at_the_last_step(
        tmp_path, monkeypatch):
    """A run whose steps take minutes is not stalled by a fixed bound: the follower waits for 10 x the longest
    wait between two step events so far when that is longer than 10 collective timeouts; after the last step
    (the probe, the final save) it watches nothing."""
    from types import SimpleNamespace

    from ddpviz.engine.modes import launcher

    clock = [100.0]
    monkeypatch.setattr(launcher, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    f = launcher._Follower(tmp_path, 1, None, None, stall_s=10.0, last_step=99)
    f.step_seen, f.step_at, f.longest = 5, 100.0, 3.0  # steps came 3 s apart: 30 s allowed
    clock[0] = 129.0
    f._check_stall()
    assert f.stalled is None
    clock[0] = 131.0
    f._check_stall()
    assert f.stalled == (5, 31.0)
    f = launcher._Follower(tmp_path, 1, None, None, stall_s=10.0, last_step=99)
    f.step_seen, f.step_at = 99, 100.0
    clock[0] = 10_000.0
    f._check_stall()
    assert f.stalled is None


def test_cancel_stops_every_rank_process():
    started = time.monotonic()
    seen = []

    def should_stop():
        seen.extend(p.pid for p in children_alive())
        return time.monotonic() - started > 8

    sink = ListSink()
    result = run_training(RunConfig(**{**BASE, "steps": 100000, "step_delay_s": 0.01}), sink, "c",
                          should_stop=should_stop)
    assert result.status == "canceled"
    assert seen, "rank processes should have been running before the cancel"
    assert not children_alive()
    assert sink.events[-1]["status"] == "canceled"


def test_a_cancel_before_the_ranks_have_started_still_stops_them():
    # should_stop is True from the first look, before any rank has said its pid: the ranks that
    # start afterwards are stopped too, long before their 3,000 steps (~30 s) would end.
    sink = ListSink()
    result = run_training(RunConfig(**{**BASE, "steps": 3000, "step_delay_s": 0.01}), sink, "c0",
                          should_stop=lambda: True)
    assert result.status == "canceled"
    assert len(sink.of_type("step")) < 2 * 3000 // 10
    assert not children_alive()


def test_dp_device_thread_failure_fails_the_whole_process_run():
    result, _, _ = run(mode="dp", fault="raise", fault_rank=1, fault_step=1)
    assert result.status == "failed" and result.error["rank"] == 1


def test_diverged_replicas_fail_the_ddp_run_at_the_check():
    result, sink, _ = run(fault="diverge", fault_rank=1, fault_step=1, eval_every=2, steps=6)
    assert result.status == "failed"
    assert "replicas diverged at step 1" in result.error["exception"]
    (sync,) = sink.of_type("sync")
    assert sync["in_sync"] is False and sync["checksums"][0] != sync["checksums"][1]
    # the record says the fault was injected, where and when, whichever rank's error is shown (a check step and
    # another rank can be what the user sees first)
    assert "injected fault=diverge: rank 1's weights nudged by +0.001 at step 1" in result.error["exception"]
    (said,) = [e for e in sink.of_type("log") if "injected fault=diverge" in e["message"]]
    assert said["rank"] == 1 and said["step"] == 1


def test_a_diverge_fault_off_a_check_step_still_says_it_was_injected_in_dp():
    # DP with fault_step 1 and checks at steps 2 and 3 only: it succeeds, every check is in sync, and its record
    # says what was injected (a new user saw "succeeded", in sync, and no trace of the fault, 2026-12-06)
    result, sink, _ = run(mode="dp", fault="diverge", fault_rank=0, fault_step=1, eval_every=3, steps=4)
    assert result.status == "succeeded" and all(e["in_sync"] for e in sink.of_type("sync"))
    (said,) = [e for e in sink.of_type("log") if "injected fault=diverge" in e["message"]]
    assert said["step"] == 1 and "device 0's weights nudged" in said["message"] and "for good" in said["message"]


def test_a_diverged_dp_replica_is_seen_at_its_step_and_gone_at_the_next():
    # DP rebuilds its replicas from device 0 every step: the nudged replica computes step 1's
    # gradient with drifted weights (so training differs) and is thrown away with the step.
    result, sink, _ = run(mode="dp", fault="diverge", fault_rank=1, fault_step=1, eval_every=1, steps=4)
    clean, _, _ = run(mode="dp", eval_every=1, steps=4)
    assert result.status == "succeeded"
    verdicts = {e["step"]: e["in_sync"] for e in sink.of_type("sync")}
    assert verdicts == {0: True, 1: False, 2: True, 3: True}
    (bad,) = [e for e in sink.of_type("sync") if e["step"] == 1]
    assert bad["checksums"][1] != bad["checksums"][0]
    assert (result.final_params - clean.final_params).abs().max() > 1e-6


def test_a_rank_that_raised_and_then_died_of_a_signal_is_reported_by_its_exception(tmp_path):
    """The race behind the flaky multi-host root-cause test: rank 1 raises, writes its exception,
    and its teardown then ends in SIGABRT (gloo aborting on a peer that is gone). The exception it
    wrote is the root cause, not the signal; a rank killed without writing one is named by its
    signal (issue 12, case 13)."""
    import json
    import signal as signals

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from ddpviz.engine.modes.launcher import root_cause

    own = {"rank": 1, "step": 2, "host": "hostB", "exception": "InjectedFault: injected fault: rank 1 "
           "raised at step 2", "traceback": "Traceback ... maybe_fail"}
    (tmp_path / "local0.error.json").write_text(json.dumps(own))
    abort = ProcessFailure(local_rank=0, pid=4321, exitcode=-signals.SIGABRT, error_file=str(tmp_path / "none"))
    failure = ChildFailedError("rank_main", {1: abort})
    failure._rank_offset = 1  # this host runs global rank 1 as its local rank 0
    assert root_cause(failure, tmp_path, 1) == own
    (tmp_path / "local0.error.json").unlink()  # killed before it could write anything
    err = root_cause(failure, tmp_path, 1)
    assert err["rank"] == 1 and err["exception"] == "rank 1 (pid 4321) was killed by signal SIGABRT"
