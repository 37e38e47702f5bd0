"""RunWindow: incremental reads from the last stream id, bounded windows, stop when drained."""

from app.window import RunWindow

import eventgen as g
from fakeclient import FakeClient

CFG = {"mode": "ddp", "world_size": 2, "steps": 40}


def test_poll_reads_incrementally_from_last_id():
    c = FakeClient()
    c.add_run("r", CFG, status="started", events=[g.run_started("r", "ddp", steps=40)])
    w = RunWindow("r", batch=10)
    assert w.poll(c) == 1 and w.started is not None and w.last_id == "1-0"
    c.streams["r"] += g.ddp_step("r", 0)
    assert w.poll(c) == len(g.ddp_step("r", 0))
    assert w.poll(c) == 0  # nothing new: nothing re-read
    assert w.steps_done == 1 and w.steps_total == 40 and not w.done


def test_windows_are_bounded():
    events = [e for s in range(30) for e in g.ddp_step("r", s)]
    w = RunWindow("r", max_steps=10)
    w.ingest(events)
    steps = {e["step"] for e in w.of_type("step")}
    assert steps == set(range(20, 30))
    assert {e["step"] for e in w.of_type("bucket")} == {28, 29}
    assert {e["step"] for e in w.of_type("comm_volume")} == {28, 29}
    assert w.latest_step == 29


def test_done_only_after_terminal_and_drained():
    c = FakeClient()
    events = g.full_run("r", "ddp", steps=5)
    c.add_run("r", CFG, status="started", events=events[:10])
    w = RunWindow("r", batch=4, max_batches=2)
    w.poll(c)
    assert not w.done and w.last_id == "8-0"  # capped at 2 batches per poll
    c.streams["r"] = events
    c.runs["r"]["status"] = "finished"
    while not w.done:
        w.poll(c)
    assert w.finished is not None and w.finished["status"] == "succeeded"
    before = w.last_id
    assert w.poll(c) == 0 and w.last_id == before  # a done window reads nothing more


def test_error_from_record_or_event():
    c = FakeClient()
    err = {"rank": 1, "exception": "RuntimeError: boom", "traceback": "Traceback...\nboom"}
    events = [g.run_started("r", "ddp"), g.run_finished("r", 0, "failed", err)]
    c.add_run("r", CFG, status="failed", events=events)
    w = RunWindow("r")
    w.poll(c)
    assert w.done and w.error == err and w.status == "failed"


def test_min_interval_skips_reads():
    c = FakeClient()
    c.add_run("r", CFG, status="started", events=[g.run_started("r", "ddp")])
    w = RunWindow("r")
    w.poll(c)
    c.streams["r"] += g.ddp_step("r", 0)
    assert w.poll(c, min_interval_s=60) == 0
    assert w.poll(c) > 0
