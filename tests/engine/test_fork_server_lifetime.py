"""The rank fork server lives as long as the process that started it, not the thread: a DDP run
launched from a thread that ends must not take the server (and a later run's ranks) with it.
Red with prctl(PR_SET_PDEATHSIG) in engine/modes/fork_server.py: run b's rank exits with 255."""

from __future__ import annotations

import threading
import pytest

from ddpviz.engine.config import RunConfig
from ddpviz.engine.run import run_training

pytestmark = pytest.mark.slow

BASE = dict(model="mlp", dataset="digits", width=16, depth=1, global_batch_size=32, eval_every=0,
            mode="ddp", world_size=2, probe=False)


class Quiet:
    def emit(self, e):
        pass

    def close(self):
        pass


def test_a_run_outlives_the_thread_that_started_the_fork_server(tmp_path):
    res = {}

    a_started = threading.Event()

    class Marks(Quiet):
        def emit(self, e):
            if e.get("type") == "step":
                a_started.set()

    def first():  # starts the server; its thread ends while the second run trains
        res["a"] = run_training(RunConfig(**BASE, steps=20, step_delay_s=0.05), Marks(), "a",
                                workdir=tmp_path / "a")

    def second():
        a_started.wait(120)  # the server is up: the second run's ranks come from it
        res["b"] = run_training(RunConfig(**BASE, steps=300, step_delay_s=0.02), Quiet(), "b",
                                workdir=tmp_path / "b")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert res["a"].status == "succeeded", res["a"].error
    assert res["b"].status == "succeeded", res["b"].error


def test_a_follower_kills_only_its_own_runs_fork_server_never_a_later_one(tmp_path, monkeypatch):
    """A canceled run's follower killed whatever fork server the process had at each pass: one that outlived its
    run killed the server a later test had just started, whose ranks then failed ("EOFError: unexpected EOF",
    multiprocessing.forkserver.read_signed; a clean-clone CI, 2026-12-06). Stand-ins: two child processes, the
    run's server and a later one; multiprocessing's record names the later one."""
    import subprocess
    from multiprocessing import forkserver

    from ddpviz.engine.modes.launcher import RankFollower

    own, later = (subprocess.Popen(["sleep", "30"]) for _ in range(2))
    try:
        state = forkserver._forkserver
        monkeypatch.setattr(state, "_forkserver_pid", later.pid)
        follower = RankFollower(tmp_path, 2, None, None)  # no rank has written its info: none started
        follower.server_pid, follower.canceled = own.pid, True
        follower.kill_ranks()
        assert later.poll() is None and own.poll() is None  # the later server is not this run's: left alone
        monkeypatch.setattr(state, "_forkserver_pid", own.pid)  # while its own server runs: that one goes
        follower.kill_ranks()
        assert own.wait(timeout=10) == -9 and later.poll() is None
    finally:
        for p in (own, later):
            p.kill()
            p.wait()
