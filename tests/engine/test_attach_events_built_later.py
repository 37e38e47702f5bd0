"""An attached script's events are built on the writer thread, not on the script's (issue 31): the script's
thread hands the sink a `Later` (one append), and the event the writer builds from it is the one `make_event`
gives, stamped when the script emitted it, not when the writer built it. Reference: `make_event` called
directly with the same fields."""

from __future__ import annotations

import time

from ddpviz.engine.attach.env import RUN_ID_ENV, SPOOL_ENV
from ddpviz.engine.attach.session import Session
from ddpviz.engine.batching import BatchingSink, Later
from ddpviz.engine.events import make_event


class Kept:
    def __init__(self):
        self.events: list[dict] = []

    def write_batch(self, events):
        self.events.extend(events)

    def close(self):
        pass


def test_an_attached_event_leaves_the_script_thread_unbuilt_and_is_built_as_make_event_builds_it(tmp_path):
    writer = Kept()
    sink = BatchingSink(writer, flush_interval_s=60)  # writes only when flushed
    s = Session({RUN_ID_ENV: "r", SPOOL_ENV: str(tmp_path), "RANK": "1", "WORLD_SIZE": "2"}, sink=sink)
    before = time.time()
    s.emit("step", step=3, loss=float("nan"), step_time_s=0.25)
    s.emit_many("bucket", [dict(bucket_index=0, nbytes=8), dict(bucket_index=1, nbytes=4, rank=7)], step=3)
    after = time.time()
    assert [type(item) for item in sink._buf] == [Later, Later], "built on the script's thread"
    time.sleep(0.05)
    built_from = time.time()
    sink.close()
    step, b0, b1 = writer.events
    assert before <= step["ts"] <= after < built_from and b0["ts"] == b1["ts"] and before <= b0["ts"] <= after
    want = make_event("step", "r", step=3, loss=float("nan"), step_time_s=0.25, rank=1, device="cpu:1",
                      host=s.hostname)
    assert {**step, "ts": 0} == {**want, "ts": 0} and step["loss_nonfinite"] == "nan"
    assert {**b0, "ts": 0} == {**make_event("bucket", "r", bucket_index=0, nbytes=8, step=3, rank=1, device="cpu:1",
                                            host=s.hostname), "ts": 0}
    assert b1["rank"] == 7, "a row's own field wins over the session's, as with make_event"
