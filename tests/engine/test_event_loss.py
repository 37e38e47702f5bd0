"""Lost events are visible in the run (issue 20, item 10): a write that fails is counted, reported
by a `log` event as soon as a write succeeds again, and summed into the summary's `events_lost`;
a rank whose event file fails to the end leaves `local<L>.lost.json`, which the launcher reports.

The failures are real where they can be: writes to /dev/full fail with ENOSPC, as on a full disk.
Every count is the test's own (events it emitted minus events that arrived), never the sink's."""

import json
import os
import time
from pathlib import Path

import pytest

from ddpviz.engine.events import JsonlWriter, ListSink, make_event, read_jsonl
from ddpviz.engine.batching import BatchingSink
from ddpviz.engine.summary import SummaryBuilder

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")


class FailingFirst:
    """A writer whose first `fail` batches raise OSError (as a full disk does), then keep events."""

    def __init__(self, fail: int):
        self.fail, self.events = fail, []

    def write_batch(self, events):
        if self.fail:
            self.fail -= 1
            raise OSError(28, "No space left on device")
        self.events.extend(events)

    def close(self):
        pass


def _steps(n, start=0):
    return [make_event("step", "run1", rank=1, device="cpu:1", step=i, loss=1.0) for i in range(start, start + n)]


def test_a_failed_write_is_reported_by_a_log_event_the_next_write_carries():
    writer = FailingFirst(fail=1)
    sink = BatchingSink(writer, flush_interval_s=60)  # writes only when flushed
    for e in _steps(7):
        sink.emit(e)
    sink.flush()  # this write fails
    for e in _steps(5, start=7):
        sink.emit(e)
    sink.close()
    arrived = [e for e in writer.events if e["type"] == "step"]
    lost = 12 - len(arrived)
    assert [e["step"] for e in arrived] == list(range(7, 12)) and lost == 7
    (log,) = [e for e in writer.events if e["type"] == "log"]
    assert writer.events[0] is log, "the report comes before the events that follow the loss"
    assert log["events_lost"] == lost and log["level"] == "error" and "No space left" in log["error"]
    assert (log["run_id"], log["rank"], log["device"]) == ("run1", 1, "cpu:1")
    assert sink.unreported_lost == 0
    builder = SummaryBuilder()
    for e in writer.events:
        builder.observe(e)
    assert builder.summary()["events_lost"] == lost


def test_a_summary_without_losses_says_zero():
    builder = SummaryBuilder()
    for e in _steps(3):
        builder.observe(e)
    builder.observe(make_event("log", "run1", level="info", message="waiting for a GPU"))
    assert builder.summary()["events_lost"] == 0


def test_writes_to_a_full_disk_lose_events_the_sink_counts_and_keeps_unreported(tmp_path):
    sink = BatchingSink(JsonlWriter("/dev/full"), flush_interval_s=0.01)
    for e in _steps(20):
        sink.emit(e)
    time.sleep(0.05)
    sink.close()
    assert sink.lost_events == 20 and sink.unreported_lost == 20
    assert isinstance(sink.last_error, OSError)


def test_a_jsonl_writer_that_fails_leaves_no_half_batch_behind(tmp_path):
    path = tmp_path / "local0.jsonl"
    w = JsonlWriter(path)
    w.write_batch(_steps(2))
    size = path.stat().st_size
    real_write = w._fh.write
    w._fh.write = lambda data: real_write(bytes(data[:len(data) // 2])) and (_ for _ in ()).throw(
        OSError(28, "No space left on device"))  # half the batch reaches the file, then ENOSPC
    with pytest.raises(OSError):
        w.write_batch(_steps(3, start=2))
    w._fh.write = real_write
    assert path.stat().st_size == size
    w.write_batch(_steps(1, start=5))
    w.close()
    assert [e["step"] for e in read_jsonl(path)] == [0, 1, 5]


def test_a_rank_whose_event_file_fails_leaves_its_loss_and_the_launcher_reports_it(tmp_path, monkeypatch):
    from ddpviz.engine.config import RunConfig
    from ddpviz.engine.modes import ranks
    from ddpviz.engine.modes.launcher import report_lost

    monkeypatch.setattr(ranks, "die_with_parent", lambda: None)  # this is pytest, not a rank process
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "0")
    os.symlink("/dev/full", tmp_path / "local0.jsonl")  # the rank's event file: every write fails
    emitted = []

    def train(cfg, run_id, rank, wd, backend, kind, sink, host):
        for i in range(9):
            e = make_event("step", run_id, rank=rank, device=f"cpu:{rank}", step=i)
            emitted.append(e)
            sink.emit(e)

    cfg = RunConfig(mode="ddp", world_size=2, steps=9).to_json_dict()
    ranks.run_rank(train, cfg, "run1", str(tmp_path), "gloo", "cpu")
    lost = json.loads(Path(tmp_path / "local0.lost.json").read_text())
    assert lost["rank"] == 3 and lost["events_lost"] == len(emitted) == 9

    os.unlink(tmp_path / "local0.jsonl")
    out = ListSink()
    assert report_lost(tmp_path, 1, out, "run1") == 9
    (log,) = out.of_type("log")
    assert log["rank"] == 3 and log["events_lost"] == 9 and "No space left" in log["error"]
    builder = SummaryBuilder()
    builder.observe(log)
    assert builder.summary()["events_lost"] == 9
