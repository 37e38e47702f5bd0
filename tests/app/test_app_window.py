"""RunWindow: incremental reads from the last stream id, bounded windows, stop when drained."""

import gc
import threading

import eventgen as g
from fakeclient import FakeClient

from ddpviz.app.window import RunWindow, gc_paused

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


def test_the_collector_is_off_while_a_window_reads_and_back_on_after():
    seen = []

    class Spy(FakeClient):
        def read_events(self, *a, **kw):
            seen.append(gc.isenabled())
            return super().read_events(*a, **kw)

    c = Spy()
    c.add_run("r", CFG, status="started", events=[g.run_started("r", "ddp", steps=40)])
    assert gc.isenabled()
    RunWindow("r", batch=10).poll(c)
    assert seen == [False] and gc.isenabled()


def test_the_collector_comes_back_when_the_last_concurrent_reader_leaves():
    inside, leave = threading.Event(), threading.Event()

    def reader():
        with gc_paused():
            inside.set()
            leave.wait(5)

    t = threading.Thread(target=reader)
    t.start()
    inside.wait(5)
    with gc_paused():
        pass
    assert not gc.isenabled()  # the other reader is still inside
    leave.set()
    t.join(5)
    assert gc.isenabled()
    # readers that keep overlapping: one leaving after GC_MAX_OFF_S runs a collection
    import ddpviz.app.window as window

    collections = gc.get_stats()[2]["collections"]
    inside.clear()
    leave.clear()
    t = threading.Thread(target=reader)
    t.start()
    inside.wait(5)
    window._gc_off_since -= window.GC_MAX_OFF_S + 1  # as if paused that long
    with gc_paused():
        pass
    assert gc.get_stats()[2]["collections"] == collections + 1 and not gc.isenabled()
    leave.set()
    t.join(5)
    assert gc.isenabled()
    gc.disable()  # a process that had it off keeps it off
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_windows_are_bounded():
    events = [e for s in range(30) for e in g.ddp_step("r", s)]
    w = RunWindow("r", max_steps=10, recent_steps=2, first_steps=0, spread=3)
    w.ingest(events)
    steps = {e["step"] for e in w.of_type("step")}
    assert steps == set(range(20, 30))
    # detail: the newest 2 and a spread of at most 3 (by hand: 29 // 8 + 1 = 4 > 3, stride 16: 0 and 16)
    assert {e["step"] for e in w.of_type("bucket")} == {0, 16, 28, 29}
    assert {e["step"] for e in w.of_type("comm_volume")} == {0, 16, 28, 29}
    assert w.latest_step == 29


def test_detail_steps_kept_across_a_run_read_a_poll_at_a_time_or_at_once():
    events = [e for s in range(300) for e in g.ddp_step("r", s)]
    at_once, polled = RunWindow("r"), RunWindow("r")
    at_once.ingest(events)
    for i in range(0, len(events), 37):
        polled.ingest(events[i:i + 37])
    # by hand: 299 // 16 + 1 = 19 > 12, 299 // 32 + 1 = 10: every 32nd step, with 0, 1 and the newest 8
    want = {0, 1} | set(range(0, 300, 32)) | set(range(292, 300))
    for w in (at_once, polled):
        assert {e["step"] for e in w.of_type("bucket")} == want
        assert {e["step"] for e in w.of_type("dp_phase") + w.of_type("comm_volume")} <= want


def test_done_only_after_terminal_and_drained():
    c = FakeClient()
    events = g.full_run("r", "ddp", steps=5)
    c.add_run("r", CFG, status="started", events=events[:10])
    w = RunWindow("r", batch=4, max_batches=2)
    w.poll(c)
    assert not w.done and w.last_id == "8-0"  # capped at 2 batches per poll
    c.streams["r"] = events
    c.runs["r"]["status"] = "succeeded"
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


def _long_run(client, run_id: str, steps: int) -> list[dict]:
    from ddpviz.workers.sink import RedisStreamWriter
    from ddpviz.workers.store import RunStore

    events = g.full_run(run_id, "ddp", steps=steps)
    RunStore(client.redis).create(run_id, {**CFG, "steps": steps})
    RedisStreamWriter(client.redis, run_id).write_batch(events)
    return events


class CountingClient:
    """Counts the events a window reads through a real client."""

    def __init__(self, client):
        self.client, self.read = client, 0

    def get_run(self, run_id):
        return self.client.get_run(run_id)

    def read_events(self, *a, **kw):
        events, last = self.client.read_events(*a, **kw)
        self.read += len(events)
        return events, last

    def read_tail(self, *a, **kw):
        events, last = self.client.read_tail(*a, **kw)
        self.read += len(events)
        return events, last


def test_opening_a_long_run_reads_head_and_tail_and_keeps_what_a_full_read_keeps(real_client):
    # 400 steps x 12 events: a full read goes through all ~4,800; the window keeps the first
    # 2 steps and the newest 20 steps (bucket details: newest 8), so head + tail suffice.
    _long_run(real_client, "long", 400)
    counting = CountingClient(real_client)
    opened = RunWindow("long", max_steps=20, batch=100, recent_steps=8, first_steps=2)
    opened.poll(counting)
    full = RunWindow("long", max_steps=20, batch=100, recent_steps=8, first_steps=2)
    while full.poll(FullReader(real_client)):
        pass
    assert opened.finished is not None and opened.latest_step == full.latest_step == 399
    assert opened.steps_done == full.steps_done == 400
    for t in ("step", "memory"):
        assert opened.of_type(t) == full.of_type(t), t
    # head (100) + the tail for ~21 steps at the head's density (100 events over 9 steps)
    assert counting.read <= 100 + 100 + 100 * 21 // 9 + 1 < 4800 // 5
    # the tail went back ~21 steps (to 384, a spread step); the middle is not read yet
    assert {e["step"] for e in opened.of_type("bucket")} == {0, 1, 384, *range(392, 400)}
    while opened.unread_steps is not None:  # the next polls read the middle, keeping its spread steps
        opened.poll(counting)
    # by hand: 399 // 32 + 1 = 13 > 12, so every 64th step, with 0, 1 and the newest 8
    assert {e["step"] for e in full.of_type("bucket")} == {0, 1, 64, 128, 192, 256, 320, 384, *range(392, 400)}
    for t in ("bucket", "comm_volume"):  # the same events (a step cut by the head may come in another order)
        assert sorted(map(_key, opened.of_type(t))) == sorted(map(_key, full.of_type(t))), t


def _key(e: dict) -> str:
    import json

    return json.dumps(e, sort_keys=True)


class FullReader:
    """A client without `read_tail`: the window reads the stream from the start."""

    def __init__(self, client):
        self.client = client

    def get_run(self, run_id):
        return self.client.get_run(run_id)

    def read_events(self, *a, **kw):
        return self.client.read_events(*a, **kw)


def test_a_window_opened_on_a_short_or_running_stream_reads_on_from_the_tail(real_client):
    from ddpviz.workers.sink import RedisStreamWriter

    events = _long_run(real_client, "r", 3)
    w = RunWindow("r", batch=1000)
    w.poll(real_client)
    assert w.latest_step == 2 and len(w.of_type("step")) == 6  # short: the head was all of it
    more = g.ddp_step("r", 3)
    RedisStreamWriter(real_client.redis, "r").write_batch(more)
    assert w.poll(real_client) == len(more) and w.latest_step == 3
    assert len(events) > 0


def test_read_tail_returns_the_newest_events_after_an_id_oldest_first(real_client):
    _long_run(real_client, "t", 5)
    everything, last = real_client.read_events("t", count=10_000)
    first_ten, after = real_client.read_events("t", count=10)
    tail, tail_last = real_client.read_tail("t", after_id=after, count=7)
    assert tail == everything[-7:] and tail_last == last
    short, short_last = real_client.read_tail("t", after_id=after, count=10_000)
    assert short == everything[10:] and short_last == last
    assert real_client.read_tail("t", after_id=last) == ([], last)


def test_a_sets_picker_label_names_its_ddp_knobs_and_a_run_that_did_not_succeed():
    """The tour (issue 33): every set read "DP · DDP — mlp ×2, 300 steps — time". A preset's knobs
    (those unlike RunConfig's defaults: bucket cap 25 MiB, no hook, auto timing, overlap on) and a
    failed run are named; a set of defaults names none."""
    from ddpviz.app.runsets import set_label

    cfg = {"model": "mlp", "world_size": 2, "steps": 300, "bucket_cap_mb": 0.1, "comm_hook": "powersgd"}
    members = [{"run_id": "a", "status": "failed", "group": "g1", "created_at": T0_SET,
                "config": {**cfg, "mode": "dp"}},
               {"run_id": "b", "status": "failed", "group": "g1", "created_at": T0_SET,
                "config": {**cfg, "mode": "ddp", "bucket_timing": "auto", "overlap": True}}]
    label = set_label(members)
    assert "300 steps, bucket cap 0.1 MiB, powersgd hook — " in label and label.endswith("(g1) · failed")
    plain = [dict(m, status="succeeded", config={**m["config"], "bucket_cap_mb": 25.0, "comm_hook": "none"})
             for m in members]
    assert "300 steps — " in set_label(plain) and not set_label(plain).endswith("failed")
    # an attached run's config has no comm_hook: no "None hook" (a new user, 2026-12-06); a lone single run
    # trains one device whatever its world_size ("mlp ×4" was shown for `--mode single --world-size 4`)
    attached = [{"run_id": "c", "status": "failed", "created_at": T0_SET,
                 "config": {"model": "Sequential", "world_size": 2, "steps": 4, "mode": "ddp", "comm_hook": None,
                            "bucket_timing": None, "bucket_cap_mb": 0.1}}]
    assert "Sequential ×2, 4 steps, bucket cap 0.1 MiB — " in set_label(attached)
    assert "None" not in set_label(attached)
    single = [{"run_id": "d", "status": "succeeded", "created_at": T0_SET,
               "config": {"model": "mlp", "world_size": 4, "steps": 5, "mode": "single"}}]
    assert "mlp ×1, 5 steps — " in set_label(single)


T0_SET = 1_700_000_000.0
