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
