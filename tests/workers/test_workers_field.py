"""Cases from the field (issue 12), worker side: labels of pairs and trios, `ddpviz runs` columns,
run metadata kept in the record past the stream's cap, one meaning of `host`."""

from __future__ import annotations

import socket

import pytest
from wtools import TINY, cli_env, ddpviz

from ddpviz.workers import keys
from ddpviz.workers.cli.commands import runs_table
from ddpviz.workers.client import DdpvizClient
from ddpviz.workers.sweeps import submit_trio


@pytest.fixture
def client(redis_client):
    return DdpvizClient(redis=redis_client)


# -- 12: a label given to a pair or trio is kept ----------------------------------------------------

def test_a_labelled_pair_and_trio_keep_the_label(client):
    dp, ddp = client.submit_pair({**TINY}, label="X")
    assert [client.get_run(r)["label"] for r in (dp, ddp)] == ["X · DP", "X · DDP"]
    _, ids = submit_trio(client, {**TINY}, label="sweep 3")
    assert [client.get_run(ids[m])["label"] for m in ("single", "dp", "ddp")] == \
        ["sweep 3 · single", "sweep 3 · DP", "sweep 3 · DDP"]
    plain = client.submit_pair({**TINY})  # no label: the members' own names, as before
    assert [client.get_run(r)["label"] for r in plain] == ["DP", "DDP"]


def test_submit_pair_with_label_on_the_command_line(client, redis_url):
    res = ddpviz("submit", "--pair", "--label", "night run", "--steps", "3", env=cli_env(redis_url))
    assert res.returncode == 0, res.stderr
    ids = res.stdout.split()
    assert [client.get_run(r)["label"] for r in ids] == ["night run · DP", "night run · DDP"]


def column_starts(header: str) -> list[int]:
    return [header.index(h) for h in header.split()]


def test_runs_columns_line_up_whatever_the_label_length(client, redis_url):
    for label in ("a", "a much longer label than eight characters", None):
        client.submit({**TINY}, label=label)
    res = ddpviz("runs", env=cli_env(redis_url))
    assert res.returncode == 0, res.stderr
    header, *rows = res.stdout.splitlines()
    assert len(rows) == 3 and "a much longer label than eight characters" in res.stdout  # not cut
    mode_at, status_at = header.index("MODE"), header.index("STATUS")
    for row in rows:
        assert row[mode_at:mode_at + 3] == "ddp", row  # every MODE cell starts under its header
        assert row[status_at:status_at + 6] == "queued", row


def test_runs_table_pads_every_column_to_its_widest_cell():
    rec = dict(run_id="r" * 16, status="succeeded", label="L" * 30, config={"mode": "dp", "world_size": 2,
               "steps": 5}, created_at=None, started_at=None, finished_at=None, worker="w1")
    header, row = runs_table([rec])
    assert header.index("MODE") == row.index(" dp ") + 1
    assert header.index("WORKER") == row.index("w1")


def test_runs_table_counts_a_single_run_of_a_set_as_one_device():
    """A set's single run keeps the set's world_size (2) in its config and trains on one device: `ddpviz runs`
    read "single 2" where the app's Runs table reads 1 (a new user, 2026-12-06)."""
    def rec(mode):
        return dict(run_id=mode * 4, status="succeeded", label=None, config={"mode": mode, "world_size": 2,
                    "steps": 5}, created_at=None, started_at=None, finished_at=None, worker="w1")
    header, single, ddp = runs_table([rec("single"), rec("ddp")])
    at = header.index("DEVICES") + len("DEVICES") - 1  # right-aligned under its header
    assert (single[at], ddp[at]) == ("1", "2")



def test_runs_table_says_the_steps_a_run_did_where_it_ended_short():
    """A pair's DP canceled at step 110 of 400 read STEPS 400, an attached run 4 (the steps it stores): a new user
    could not tell asked from done (2026-12-06)."""
    from ddpviz.workers.cli.commands import steps_cell

    canceled = dict(config={"steps": 400}, summary={"steps_done": 110})
    assert steps_cell(canceled) == "110/400"
    assert steps_cell(dict(config={"steps": 400}, summary={"steps_done": 400})) == "400"
    assert steps_cell(dict(config={"steps": 400}, summary=None)) == "400"  # queued or running
    assert steps_cell(dict(config={"steps": 4, "attached": True}, summary={"steps_done": 4})) == "4"


# -- 14, 19: run_started kept in the record; host = the worker ------------------------------------

@pytest.mark.slow
def test_a_run_that_overflows_the_stream_cap_keeps_its_metadata(client, redis_client):
    """A DDP run writing ~14 events per step for 40 steps into a stream capped at 100 entries."""
    from ddpviz.app.window import RunWindow
    from ddpviz.workers.jobs.run import run_job

    cfg = {**TINY, "mode": "ddp", "width": 32, "depth": 1, "steps": 40, "step_delay_s": 0,
           "bucket_cap_mb": 0.001}  # 1,048 B: the head (1,320 B) fills bucket 0
    run_id = client.submit(cfg)
    assert run_job(redis_client, run_id, worker_name="field-worker", stream_maxlen=100) == "succeeded"
    first = client.read_events(run_id, count=1)[0][0]
    assert first["type"] != "run_started"  # the cap trimmed it from the stream
    assert redis_client.xlen(keys.events(run_id)) < 40 * 4
    w = RunWindow(run_id)
    while not w.done:
        w.poll(client)
    grad_bytes = (64 * 32 + 32 + 32 * 10 + 10) * 4  # Linear(64, 32) + Linear(32, 10), float32
    assert w.started["grad_bytes"] == grad_bytes
    preview = w.started["bucket_preview"]
    assert sum(b["nbytes"] for b in preview["rebuilt"]) == grad_bytes and len(preview["rebuilt"]) > 1
    assert (w.started["host"], w.started["hostname"]) == ("field-worker", socket.gethostname())


def test_the_worker_names_itself_as_host_and_keeps_run_started(client, redis_client, monkeypatch):
    import ddpviz.engine.run
    from ddpviz import engine  # noqa: E402
    from ddpviz.engine.events import make_event
    from ddpviz.engine.result import RunResult
    from ddpviz.workers.jobs.run import run_job

    def run_training(cfg, sink, run_id, *, should_stop=None, workdir=None):
        sink.emit(make_event("run_started", run_id, host=None, hostname="machine-1", grad_bytes=123))
        sink.emit(make_event("run_finished", run_id, status="succeeded", error=None, summary={}))
        return RunResult(status="succeeded", summary={})

    monkeypatch.setattr(engine.run, "run_training", run_training)
    run_id = client.submit({**TINY})
    run_job(redis_client, run_id, worker_name="w-7")
    started = client.get_run(run_id)["started"]
    assert (started["host"], started["hostname"], started["grad_bytes"]) == ("w-7", "machine-1", 123)
    (event,), _ = client.read_events(run_id, count=1)
    assert event["type"] == "run_started" and event["host"] == "w-7"
