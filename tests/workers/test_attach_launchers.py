"""`ddpviz run` with launchers other than torchrun (issue 32.2): `torch.multiprocessing.spawn` and
a Lightning-style relaunch of the script (examples/attach/train_launchers.py). Each rank is
recorded with its own rank and the run's world size (from its process group: no RANK in its
environment); the parent of `spawn`, which trains nothing, writes no event file. References: each
rank's own report (pid, losses, samples)."""

from __future__ import annotations

import sys

import pytest
from attach_tools import EXAMPLES, by_rank, reports, run_attached

from ddpviz.workers.client import DdpvizClient
from ddpviz.workers.connection import connect
from ddpviz.workers.history import read_all_events

pytestmark = pytest.mark.slow
STEPS, BATCH, WORLD = 4, 8, 2  # examples/attach/train_launchers.py


@pytest.fixture(scope="module")
def client(redis_url):
    return DdpvizClient(redis=connect(redis_url))


@pytest.mark.parametrize("launcher", ["spawn", "relaunch"])
def test_every_rank_is_recorded_and_only_the_ranks(launcher, tmp_path, redis_url, client):
    cmd = [sys.executable, str(EXAMPLES / "train_launchers.py"), "--launcher", launcher]
    proc, run_id = run_attached(cmd, redis_url, tmp_path / "r.json", tmp_path / "spool")
    assert proc.returncode == 0, proc.stderr[-3000:]
    mine = reports(tmp_path / "r.json")
    rec, events = client.get_run(run_id), read_all_events(client, run_id)
    assert rec["status"] == "succeeded"
    started = [e for e in events if e["type"] == "run_started"]
    assert len(started) == 1 and started[0]["world_size"] == WORLD  # was 1 under Lightning's launcher
    assert mine[0]["spool_files"] == [f"events-rank{r}-pid{m['pid']}.jsonl" for r, m in enumerate(mine)]
    steps = by_rank(events, "step")
    for rank, m in enumerate(mine):
        rows = sorted(steps[rank], key=lambda e: e["step"])
        assert [e["step"] for e in rows] == list(range(STEPS))
        assert [e["loss"] for e in rows] == pytest.approx(m["losses"], rel=1e-6)
        assert [e["samples"] for e in rows] == [n * WORLD for n in m["samples"]]
    assert rec["summary"]["steps_done"] == STEPS
