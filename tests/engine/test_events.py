"""Sinks: batching never loses events, JSONL tails read only complete lines."""

import json
import time

from engine.events import BatchingSink, JsonlTail, JsonlWriter, ListSink, make_event, read_jsonl


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
