"""Run records, the event stream writer, and reading events back."""

from __future__ import annotations

import json
import math

import pytest

from ddpviz.engine.events import make_event
from ddpviz.engine.batching import BatchingSink
from ddpviz.workers import keys
from ddpviz.workers.client import DdpvizClient
from ddpviz.workers.sink import RedisStreamWriter
from ddpviz.workers.store import RunStatus, RunStore

CFG = {"mode": "single", "world_size": 1, "steps": 3}


def test_record_round_trip(redis_client):
    store = RunStore(redis_client)
    store.create("r1", CFG, label="DP", group="g1")
    rec = store.get("r1")
    assert {"run_id", "status", "config", "created_at", "started_at", "finished_at", "error",
            "summary", "worker", "group", "label", "timeout_s", "requeued_from",
            "requeued_as"} <= set(rec)
    assert rec["run_id"] == "r1" and rec["status"] == "queued" and rec["config"] == CFG
    assert rec["label"] == "DP" and rec["group"] == "g1"
    assert rec["started_at"] is None and rec["error"] is None and rec["summary"] is None
    assert isinstance(rec["created_at"], float)
    assert redis_client.zscore(keys.RUNS, "r1") == pytest.approx(rec["created_at"])
    assert store.get("missing") is None


def test_list_is_newest_first_and_limited(redis_client):
    store = RunStore(redis_client)
    for i in range(5):
        store.create(f"r{i}", CFG)
    assert [r["run_id"] for r in store.list(3)] == ["r4", "r3", "r2"]
    assert store.list(0) == []


def test_status_changes_are_compare_and_set(redis_client):
    store = RunStore(redis_client)
    store.create("r1", CFG)
    assert store.mark_started("r1", "w1")
    assert not store.mark_started("r1", "w2")  # no longer queued
    rec = store.get("r1")
    assert rec["status"] == "started" and rec["worker"] == "w1" and rec["started_at"] > 0
    store.request_cancel("r1", "because")
    assert store.cancel_reason("r1") == "because"
    assert store.finish("r1", RunStatus.SUCCEEDED, summary={"steps_done": 3})
    # the first terminal status wins
    assert not store.finish("r1", RunStatus.FAILED, error={"exception": "late"})
    rec = store.get("r1")
    assert rec["status"] == "succeeded" and rec["summary"] == {"steps_done": 3}
    assert rec["error"] is None and rec["finished_at"] >= rec["started_at"]
    assert store.cancel_reason("r1") is None  # finishing clears the flag in the same transaction
    with pytest.raises(ValueError):
        store.finish("r1", RunStatus.STARTED)


def test_finish_can_append_the_run_finished_event(redis_client):
    store = RunStore(redis_client)
    store.create("r1", CFG)
    err = {"rank": None, "exception": "Canceled: x", "traceback": None}
    assert store.finish("r1", RunStatus.CANCELED, error=err, allowed_from=[RunStatus.QUEUED],
                        append_event=True)
    events = DdpvizClient(redis=redis_client).tail_events("r1", 5)
    assert [e["type"] for e in events] == ["run_finished"]
    assert events[0]["status"] == "canceled" and events[0]["error"] == err
    assert events[0]["run_id"] == "r1"


def test_stream_writer_batches_every_event_in_order(redis_client):
    sink = BatchingSink(RedisStreamWriter(redis_client, "r1"), max_batch=64, flush_interval_s=0.01)
    sent = [make_event("step", "r1", step=i, loss=1.0 / (i + 1)) for i in range(300)]
    for e in sent:
        sink.emit(e)
    sink.close()
    assert sink.dropped_batches == 0
    entries = redis_client.xrange(keys.events("r1"))
    assert len(entries) == 300
    assert all(list(fields) == [b"e"] for _, fields in entries)  # one field holding the JSON
    assert [json.loads(f[b"e"]) for _, f in entries] == sent


def test_stream_stores_strict_json(redis_client):
    writer = RedisStreamWriter(redis_client, "r1")
    writer.write_batch([make_event("step", "r1", step=0, loss=math.nan, x={"y": math.inf})])
    raw = redis_client.xrange(keys.events("r1"))[0][1][b"e"].decode()
    assert "NaN" not in raw and "Infinity" not in raw
    event = json.loads(raw)
    assert event["loss"] is None and event["loss_nonfinite"] == "nan"  # engine.events: null + a marker
    assert event["x"] == {"y": None, "y_nonfinite": "inf"}


def test_stream_is_trimmed_approximately(redis_client):
    writer = RedisStreamWriter(redis_client, "r1", maxlen=100)
    for start in range(0, 5000, 500):
        writer.write_batch([make_event("step", "r1", step=i) for i in range(start, start + 500)])
    length = redis_client.xlen(keys.events("r1"))
    assert 100 <= length < 1000
    last = DdpvizClient(redis=redis_client).tail_events("r1", 1)[0]
    assert last["step"] == 4999  # trimming drops the oldest, never the tail


def test_read_events_pages_after_the_last_id(redis_client):
    client = DdpvizClient(redis=redis_client)
    assert client.read_events("r1") == ([], "0-0")
    RedisStreamWriter(redis_client, "r1").write_batch(
        [make_event("step", "r1", step=i) for i in range(10)])
    first, last = client.read_events("r1", count=4)
    assert [e["step"] for e in first] == [0, 1, 2, 3]
    rest, last2 = client.read_events("r1", last)
    assert [e["step"] for e in rest] == list(range(4, 10))
    assert client.read_events("r1", last2) == ([], last2)  # unchanged when nothing new
    assert [e["step"] for e in client.tail_events("r1", 3)] == [7, 8, 9]
    assert client.tail_events("r1", 0) == []


def test_a_forwarded_rank_line_is_stored_as_is_unless_it_holds_a_nan(tmp_path):
    from ddpviz.engine.events import JsonlTail, JsonlWriter, RawEvent, encode_json
    from ddpviz.workers.sink import encode_event

    w = JsonlWriter(tmp_path / "r.jsonl")
    w.write_batch([make_event("step", "r1", step=3, loss=0.25, start_ts=1.5)])
    w.close()
    (e,) = JsonlTail(tmp_path / "r.jsonl").read_new()
    assert encode_event(e) is e.raw and e.raw == encode_json(dict(e))
    nan_line = RawEvent({"type": "step", "loss": None}, b'{"type":"step","loss":NaN}')
    assert encode_event(nan_line) == b'{"type":"step","loss":null}'


def test_script_and_multi_exec_store_the_same_entries(redis_client):
    sent = [make_event("bucket", "r1", step=i // 3, bucket_index=i % 3) for i in range(1200)]
    scripted = RedisStreamWriter(redis_client, "a")
    scripted.write_batch(sent)
    plain = RedisStreamWriter(redis_client, "b")
    plain._use_script = False
    plain.write_batch(sent)
    a = [f[b"e"] for _, f in redis_client.xrange(keys.events("a"))]
    b = [f[b"e"] for _, f in redis_client.xrange(keys.events("b"))]
    assert a == b and [json.loads(x) for x in a] == sent and scripted.written == 1200


def test_a_server_that_refuses_scripts_gets_multi_exec(redis_client, redis_url):
    from ddpviz.workers.connection import connect

    user, password = "noscript", "pw-for-test"
    redis_client.acl_setuser(user, enabled=True, passwords=[f"+{password}"], keys=["*"],
                             commands=["+@all", "-@scripting"])
    try:
        host = redis_url.split("//", 1)[1]
        limited = connect(f"redis://{user}:{password}@{host}")
        writer = RedisStreamWriter(limited, "r1")
        writer.write_batch([make_event("step", "r1", step=i) for i in range(10)])
        assert not writer._use_script and writer.written == 10 and writer.problem is None
        assert [json.loads(f[b"e"])["step"] for _, f in redis_client.xrange(keys.events("r1"))] == \
            list(range(10))
        limited.close()
    finally:
        redis_client.acl_deluser(user)


def test_a_record_stored_as_finished_by_an_earlier_release_reads_succeeded(redis_client):
    store = RunStore(redis_client)
    run_id = "legacy1"
    store.create(run_id, {"mode": "ddp"})
    redis_client.hset(keys.run(run_id), "status", "finished")  # RQ's word, stored before 0.2
    assert store.get(run_id)["status"] == "succeeded"
    assert RunStatus("finished") is RunStatus.SUCCEEDED
