"""A run whose event stream Redis trimmed (XADD MAXLEN ~) says so, and keeps what ran (a new user, 2026-12-06: a
64-device DP run of 300 steps lost steps 0-95 and its run_started from the export and every page, silently).

The reference is the stream as written: events of steps 0..1999 after a run_started, capped at ~100 entries, so
Redis keeps only a tail (it trims whole nodes of up to 100 entries: 100-200 kept).
"""

from __future__ import annotations

import pytest

from ddpviz.app.window import RunWindow
from ddpviz.workers.cli.commands import build_parser
from ddpviz.workers.client import DdpvizClient
from ddpviz.workers.history import read_all_events, trimmed_before
from ddpviz.workers.sink import RedisStreamWriter
from ddpviz.workers.store import RunStore

STARTED = {"type": "run_started", "run_id": "r", "mode": "dp", "world_size": 64, "ts": 1.0,
           "config": {"mode": "dp", "world_size": 64, "steps": 2000}}


# what a pair's worker writes before each run's run_started (workers.jobs.pair: the turns it takes)
TURNS_LOG = {"type": "log", "level": "info", "ts": 0.5, "message": "DP and DDP train at once on worker w, in turns"}


def _run(redis_client, run_id: str, steps: int, maxlen: int, before: list[dict] = ()) -> None:
    store = RunStore(redis_client)
    store.create(run_id, STARTED["config"])
    store.save_started(run_id, {**STARTED, "run_id": run_id})
    writer = RedisStreamWriter(redis_client, run_id, maxlen)
    writer.write_batch([{**e, "run_id": run_id} for e in before] + [{**STARTED, "run_id": run_id}] + [
        {"type": "step", "run_id": run_id, "step": s, "rank": 0, "ts": 2.0 + s, "samples": 64, "step_time_s": 0.01,
         "samples_per_s": 6400.0} for s in range(steps)])


def test_a_trimmed_stream_says_where_it_starts_and_keeps_its_run_started(redis_client, redis_url, tmp_path, capsys):
    _run(redis_client, "trimmed", 2000, maxlen=100)
    client = DdpvizClient(redis=redis_client)
    raw, _ = client.read_events("trimmed", after_id="0-0", count=100)
    kept = redis_client.xlen("ddpviz:events:trimmed")
    assert 100 <= kept <= 300 and raw[0]["type"] == "step"  # the head, run_started included, is gone
    first = 2000 - kept  # every kept entry is a step, the newest ones
    assert trimmed_before(raw) == first

    events = read_all_events(client, "trimmed")
    assert events[0]["type"] == "run_started" and events[0]["world_size"] == 64  # from the run's record
    assert [e["step"] for e in events[1:]] == list(range(first, 2000))

    w = RunWindow("trimmed")
    w.poll(client)
    assert w.trimmed_before == first

    args = build_parser().parse_args(["export", "trimmed", "--url", redis_url, "--out", str(tmp_path / "t.jsonl")])
    assert args.handler(args) == 0
    assert f"steps 0-{first - 1} were trimmed from it, so this export starts at step {first}" in capsys.readouterr().err


@pytest.mark.parametrize("before", [[], [TURNS_LOG]], ids=["run_started first", "a pair's log first"])
def test_a_whole_stream_is_read_as_written(redis_client, redis_url, tmp_path, capsys, before):
    _run(redis_client, "whole", 50, maxlen=100_000, before=before)
    client = DdpvizClient(redis=redis_client)
    events = read_all_events(client, "whole")
    assert [e["type"] for e in events[:len(before) + 2]] == [e["type"] for e in before] + ["run_started", "step"]
    assert len(events) == len(before) + 51 and sum(e["type"] == "run_started" for e in events) == 1
    w = RunWindow("whole")
    w.poll(client)
    assert w.trimmed_before is None
    args = build_parser().parse_args(["export", "whole", "--url", redis_url, "--out", str(tmp_path / "w.jsonl")])
    assert args.handler(args) == 0 and "trimmed" not in capsys.readouterr().err
