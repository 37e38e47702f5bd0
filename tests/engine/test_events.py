"""Sinks: batching never loses events, JSONL tails read only complete lines."""

import json
import time

from ddpviz.engine.events import JsonlTail, JsonlWriter, ListSink, make_event, read_jsonl
from ddpviz.engine.batching import BatchingSink, Later
from ddpviz.engine.measure.telemetry import Telemetry


def test_batching_sink_delivers_everything_in_order_in_batches(tmp_path):
    writer = ListSink()
    batches = []
    writer_write = writer.write_batch
    writer.write_batch = lambda evs: (batches.append(len(evs)), writer_write(evs))
    sink = BatchingSink(writer, max_batch=100, flush_interval_s=0.05)
    for i in range(1050):
        sink.emit(make_event("log", "r", level="info", message=str(i)))
    sink.close()
    assert [e["message"] for e in writer.events] == [str(i) for i in range(1050)]
    assert max(batches) <= 100 and len(batches) < 1050 / 5


def test_batching_sink_keeps_order_while_flush_races_its_thread():
    """The emitting thread never locks; its thread and `flush()` from another thread take and write in
    turns: every event written once, in the order emitted (batches of a step's events, as a rank hands over)."""
    import threading

    writer = ListSink()
    sink = BatchingSink(writer, max_batch=7, flush_interval_s=0.001)
    stop = threading.Event()

    def flusher():
        while not stop.is_set():
            sink.flush()

    other = threading.Thread(target=flusher)
    other.start()
    for i in range(0, 6000, 3):
        sink.emit_many([make_event("log", "r", level="info", message=str(j)) for j in range(i, i + 3)])
    stop.set()
    other.join()
    sink.close()
    assert [e["message"] for e in writer.events] == [str(i) for i in range(6000)]


def _logs(*messages):
    return [make_event("log", "r", level="info", message=m) for m in messages]


def test_events_built_later_take_their_place_in_the_order_and_are_built_off_the_emitting_thread():
    """A DDP rank's ordinary steps hand over a `Later` (engine.modes.ddp.rank ordinary_events): the writer's
    thread builds its events, where `emit_many` would have put them."""
    import threading

    writer = ListSink()
    sink = BatchingSink(writer, max_batch=5, flush_interval_s=0.001)
    built_on = []

    def build(a, b):
        built_on.append(threading.current_thread().name)
        return _logs(a, b)

    for i in range(0, 300, 4):
        sink.emit(_logs(str(i))[0])
        sink.emit_later(Later(build, (str(i + 1), str(i + 2)), 2))
        sink.emit_many(_logs(str(i + 3)))
    sink.close()
    assert [e["message"] for e in writer.events] == [str(i) for i in range(300)]
    assert len(built_on) == 75 and threading.current_thread().name not in built_on


def test_a_builder_that_raises_loses_its_events_visibly_and_the_rest_arrive():
    writer = ListSink()
    sink = BatchingSink(writer, flush_interval_s=60)  # writes only when flushed

    def broken():
        raise KeyError("ready_s")

    sink.emit_many(_logs("a"))
    sink.emit_later(Later(broken, (), 3))
    sink.emit_many(_logs("b"))
    sink.flush()
    sink.emit_many(_logs("c"))
    sink.close()
    assert [e["message"] for e in writer.events if e["level"] == "info"] == ["a", "b", "c"]
    (log,) = [e for e in writer.events if e["level"] == "error"]
    assert log["events_lost"] == 3 and "ready_s" in log["error"] and sink.lost_events == 3


def test_telemetry_builds_a_later_at_once_for_a_sink_that_cannot_defer():
    sink = ListSink()
    Telemetry(sink, "r").hand_over_later(Later(_logs, ("x", "y"), 2))
    assert [e["message"] for e in sink.events] == ["x", "y"]


def test_a_flush_waits_for_a_write_in_progress():
    """A slow write (0.3 s) of the first events under way in one thread, then more events and a flush() from
    another: the later events are written after the first, never overtaking them."""
    import threading

    written, first = [], threading.Event()

    class Slow(ListSink):
        def write_batch(self, events):
            if not first.is_set():
                first.set()
                time.sleep(0.3)
            written.extend(e["message"] for e in events)

    sink = BatchingSink(Slow(), max_batch=100, flush_interval_s=60)
    sink.emit_many([make_event("log", "r", level="info", message=m) for m in ("a1", "a2")])
    slow = threading.Thread(target=sink.flush)
    slow.start()
    assert first.wait(5)
    sink.flush()  # nothing new buffered: it returns once the write under way has ended
    assert written == ["a1", "a2"]
    sink.emit_many([make_event("log", "r", level="info", message="b1")])
    sink.flush()
    slow.join()
    sink.close()
    assert written == ["a1", "a2", "b1"]


def test_writer_errors_do_not_reach_the_training_loop():
    class Broken:
        def write_batch(self, events):
            raise ConnectionError("redis went away")

        def close(self):
            pass

    sink = BatchingSink(Broken(), flush_interval_s=0.01)
    sink.emit(make_event("log", "r", level="info", message="x"))
    time.sleep(0.1)
    sink.close()
    assert sink.dropped_batches >= 1 and isinstance(sink.last_error, ConnectionError)


def test_jsonl_tail_reads_only_complete_lines(tmp_path):
    path = tmp_path / "rank0.jsonl"
    tail = JsonlTail(path)
    assert tail.read_new() == []
    with open(path, "w") as fh:
        fh.write(json.dumps({"a": 1}) + "\n" + '{"b": ')
    assert tail.read_new() == [{"a": 1}]
    with open(path, "a") as fh:
        fh.write('2}\n')
    assert tail.read_new() == [{"b": 2}]


def test_jsonl_writer_round_trip(tmp_path):
    w = JsonlWriter(tmp_path / "x.jsonl")
    w.write_batch([make_event("step", "r", step=0, loss=1.5)])
    w.close()
    (e,) = read_jsonl(tmp_path / "x.jsonl")
    assert e["type"] == "step" and e["loss"] == 1.5 and isinstance(e["ts"], float)


def test_jsonl_tail_returns_each_event_with_the_line_it_was_read_from(tmp_path):
    from ddpviz.engine.events import RawEvent

    path = tmp_path / "rank0.jsonl"
    w = JsonlWriter(path)
    w.write_batch([make_event("step", "r", step=0, loss=0.5)])
    tail = JsonlTail(path)
    (e,) = tail.read_new()
    assert isinstance(e, RawEvent) and e.raw == path.read_bytes().rstrip(b"\n")
    assert json.loads(e.raw) == dict(e)
    w.write_batch([make_event("step", "r", step=1)])  # the open handle sees what comes later
    assert [x["step"] for x in tail.read_new()] == [1]
    tail.close()
    w.close()


def test_a_raw_event_forgets_its_line_on_any_change():
    from ddpviz.engine.events import RawEvent

    changes = [lambda e: e.__setitem__("host", "h"), lambda e: e.update(host="h"),
               lambda e: e.setdefault("host", "h"), lambda e: e.pop("step"),
               lambda e: e.__delitem__("step"), lambda e: e.clear(), lambda e: e.popitem()]
    for change in changes:
        e = RawEvent({"type": "step", "step": 1}, b'{"type":"step","step":1}')
        e.setdefault("type", "kept")  # a setdefault that changes nothing still forgets: safe side
        e.raw = b'{"type":"step","step":1}'
        change(e)
        assert e.raw is None
    e = RawEvent({"step": 1}, b'{"step":1}')
    assert e["step"] == 1 and e.get("x") is None and e.raw == b'{"step":1}'  # reads keep it


def test_encode_json_is_strict_json_with_string_keys():
    import numpy as np

    from ddpviz.engine.events import encode_json

    obj = {"loss": float("nan"), "peak": float("inf"), "n": np.int64(3), "x": np.float32(0.5),
           "by_rank": {0: 1, 1: 2}, "s": {1}, "t": (1, 2), "big": 2 ** 70}
    got = json.loads(encode_json(obj))
    assert got == {"loss": None, "peak": None, "n": 3, "x": 0.5, "by_rank": {"0": 1, "1": 2},
                   "s": [1], "t": [1, 2], "big": 2 ** 70}
    assert b"NaN" not in encode_json(obj) and b" " not in encode_json({"a": [1, 2]})


def _without_ts(events):
    return [{k: v for k, v in e.items() if k != "ts"} for e in events]


def test_emit_many_gives_the_events_emit_gives_one_by_one_through_every_sink_kind():
    """The reference is `Telemetry.emit` per row: same keys and values (ts aside), non-finite floats
    marked in rows and in the common fields, a row's device overriding the rank's, in order, through a
    batching sink (`emit_many`) and through a sink that takes one event at a time."""
    import pytest

    from ddpviz.engine.events import CallbackSink
    from ddpviz.engine.measure.telemetry import Telemetry

    rows = [dict(bucket_index=0, nbytes=4096, ready_s=0.001, comm_end_s=None),
            dict(bucket_index=1, nbytes=8192, ready_s=float("nan"), comm_end_s=float("inf")),
            dict(bucket_index=2, nbytes=16, ready_s=0.003, device="cpu:7", extra={"x": float("-inf")})]
    one = ListSink()
    tel = Telemetry(one, "r", rank=1, device="cpu:1", host="h")
    for row in rows:
        tel.emit("bucket", step=5, loss=float("nan"), **row)
    batched, called = ListSink(), []
    writer = ListSink()
    sinks = [batched, BatchingSink(writer, flush_interval_s=0.01), CallbackSink(called.append)]
    for sink in sinks:
        Telemetry(sink, "r", rank=1, device="cpu:1", host="h").emit_many("bucket", rows, step=5, loss=float("nan"))
    sinks[1].close()
    want = _without_ts(one.events)
    assert want[1]["ready_s"] is None and want[1]["ready_s_nonfinite"] == "nan" and want[2]["device"] == "cpu:7"
    for got in (batched.events, writer.events, called):
        assert _without_ts(got) == want
    assert len({e["ts"] for e in batched.events}) == 1  # one emission moment for the step's rows
    with pytest.raises(ValueError, match="event type"):
        tel.emit_many("buckets", rows)
