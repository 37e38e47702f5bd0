"""An attached DDP's bookkeeping, against hand-worked figures and without processes: several DDPs
in one process (a GAN's generator and discriminator) — the step's exposed comm and its one
`comm_volume` (engine/attach/steps.py, engine/attach/volume.py `VolumeBook`) — and the CUDA path's
deferred bucket events written at exit, on stand-in events. The real two-DDP script is in
tests/engine/test_attach_hook.py."""

from __future__ import annotations

import pytest
import torch

from ddpviz.engine.attach.comm import BUCKET_BYTES
from ddpviz.engine.attach.volume import VolumeBook
from ddpviz.engine.attach.env import RUN_ID_ENV, SPOOL_ENV
from ddpviz.engine.attach.session import Session
from ddpviz.engine.attach.steps import StepTracker
from ddpviz.engine.events import ListSink


class FakeDdpWatch:
    """What the tracker asks of a DDP watch; its exposed comm in a backward is given."""

    reduces_gradients = True
    exposed_after_last_ready = True

    def __init__(self, exposed_s: float):
        self.exposed_s = exposed_s

    def begin_backward(self, synced: bool) -> None:
        pass

    def comm_split(self, step: int, micros: list[dict]) -> tuple[float, float, dict]:
        return 0.0, self.exposed_s, {}


def _session(tmp_path) -> tuple[Session, ListSink]:
    sink = ListSink()
    return Session({RUN_ID_ENV: "r", SPOOL_ENV: str(tmp_path)}, sink=sink), sink


def _backward(tracker: StepTracker) -> None:
    m = tracker.backward_start(torch.tensor(1.0))
    tracker.backward_end(m)


@pytest.mark.parametrize("one_backward, expected_s", [(True, 0.001), (False, 0.008)])
def test_ddps_reducing_in_one_backward_share_its_exposed_comm(tmp_path, one_backward, expected_s):
    # G's last bucket is ready 1 ms before its backward ends, D's 7 ms before (D's gradients come
    # first in backward). In one backward (D(G(z)).backward()) the backward waits 1 ms after the
    # last bucket of either was ready: 1 ms, not 1 + 7. In two backwards, each adds its own: 8 ms.
    s, sink = _session(tmp_path)
    tracker = StepTracker(s)
    g, d = FakeDdpWatch(0.001), FakeDdpWatch(0.007)
    for watch in (g, d):
        tracker.forward_start(watch, True, 4)
        tracker.forward_end()
        if not one_backward:
            _backward(tracker)
    if one_backward:
        _backward(tracker)
    tracker.optimizer_start()
    tracker.optimizer_end()
    s.close()
    (step,) = [e for e in sink.events if e["type"] == "step"]
    assert step["comm_exposed_s"] == pytest.approx(expected_s)
    assert step["micro_steps"] == (1 if one_backward else 2)


class ReachedDdpWatch(FakeDdpWatch):
    """A DDP watch that says whether the current backward reached its graph (`reaches`), and counts
    the steps its comm was split in."""

    def __init__(self, exposed_s: float):
        super().__init__(exposed_s)
        self.reaches, self.split_steps = False, []

    def reduced_in_backward(self) -> bool:
        return self.reaches

    def comm_split(self, step: int, micros: list[dict]) -> tuple[float, float, dict]:
        self.split_steps.append((step, len(micros)))
        return super().comm_split(step, micros)


def test_a_dcgan_step_pair_gives_each_ddp_the_backward_that_reduced_it(tmp_path):
    # PyTorch's DCGAN example: fake = G(z); D step: D(fake.detach()).backward(), optD.step(); G step:
    # D(fake).backward() (reduces D and, through fake, G), optG.step(). G's forward was in the D step;
    # its reduce is in the G step. Hand-worked: D is split in both steps, G in the G step only (one
    # backward each), so the D step's exposed comm is D's own 7 ms, not 0 from a G that reduced nothing.
    s, sink = _session(tmp_path)
    tracker = StepTracker(s)
    g, d = ReachedDdpWatch(0.002), ReachedDdpWatch(0.007)
    tracker.forward_start(g, True, 8)  # fake = G(z)
    tracker.forward_end()
    tracker.forward_start(d, True, 8)  # D step
    tracker.forward_end()
    d.reaches = True
    _backward(tracker)
    tracker.optimizer_start()
    tracker.optimizer_end()
    tracker.forward_start(d, True, 8)  # G step: D(fake)
    tracker.forward_end()
    g.reaches = True
    _backward(tracker)
    tracker.optimizer_start()
    tracker.optimizer_end()
    s.close()
    assert d.split_steps == [(0, 1), (1, 1)] and g.split_steps == [(1, 1)]
    steps = [e for e in sink.events if e["type"] == "step"]
    assert [e["comm_exposed_s"] for e in steps] == pytest.approx([0.007, 0.002])  # step 1: one backward, both reduced


class BookWatch:
    def __init__(self, ddp_index: int, world_size: int, param_bytes: int):
        self.ddp_index, self.world_size, self.param_bytes = ddp_index, world_size, param_bytes


def _records(*nbytes: int, source: str = BUCKET_BYTES) -> list[dict]:
    return [dict(nbytes=n, nbytes_source=source) for n in nbytes]


@pytest.mark.parametrize("close_first", [False, True])
def test_one_comm_volume_per_step_sums_every_ddp_that_reduced_in_it(tmp_path, close_first):
    # 4 ranks (ring factor 2·3/4 = 1.5). DDP 0: buckets of 60 and 40 B, 100 B of gradients. DDP 1
    # with an fp16 hook: 50 B handed to all-reduce of its 100 B of gradients.
    s, sink = _session(tmp_path)
    book = VolumeBook(s)
    a, b = BookWatch(0, 4, 100), BookWatch(1, 4, 100)
    book.expect(7, a)
    book.expect(7, b)
    if close_first:  # CUDA: the step ends before its buckets' events completed
        book.close(7)
    book.add(7, a, _records(60, 40))
    assert not [e for e in sink.events if e["type"] == "comm_volume"]  # DDP 1's buckets are still due
    book.add(7, b, _records(50, source="fp16 hook"))
    if not close_first:
        assert not [e for e in sink.events if e["type"] == "comm_volume"]  # the step has not ended
        book.close(7)
    (v,) = [e for e in sink.events if e["type"] == "comm_volume"]
    assert (v["step"], v["allreduce_bytes"], v["ddp_count"]) == (7, 150, 2)
    assert v["sent_bytes"] == v["recv_bytes"] == 150 + 75  # 1.5 × 100 + 1.5 × 50
    assert v["theory_sent_bytes"] == 150 + 150
    assert v["allreduce_bytes_source"] == f"{BUCKET_BYTES}; fp16 hook"


def test_a_step_where_one_ddp_stayed_in_no_sync_waits_only_for_the_other(tmp_path):
    s, sink = _session(tmp_path)
    book = VolumeBook(s)
    a = BookWatch(0, 2, 100)
    book.expect(3, a)  # DDP 1 ran under no_sync(): it expects nothing
    book.add(3, a, _records(100))
    book.close(3)
    (v,) = [e for e in sink.events if e["type"] == "comm_volume"]
    assert (v["allreduce_bytes"], v["sent_bytes"], v["ddp_count"]) == (100, 100, 1)
    book.close(4)  # a step in which no DDP reduced: no event
    assert len([e for e in sink.events if e["type"] == "comm_volume"]) == 1


class FakeEvent:
    """A CUDA event stand-in: completes when the test says the GPU got there, or on synchronize."""

    def __init__(self):
        self.done, self.waits = False, 0

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waits += 1
        self.done = True


class FakeRecorder:
    """What `Watch` reads of its `BucketRecorder` on CUDA: this step's records and origin."""

    layout: dict = {}

    def __init__(self):
        self.records, self.origin = [], None

    def resolved(self) -> list[dict]:
        return [dict(bucket_index=i, nbytes=r["nbytes"], uncompressed_nbytes=r["nbytes"], nbytes_source=BUCKET_BYTES, ready_s=0.0,
                     comm_start_s=0.0, comm_end_s=0.001) for i, r in enumerate(self.records)]


def test_the_last_steps_deferred_cuda_buckets_are_written_at_exit_and_none_before_is_waited_for(tmp_path):
    # A DDP on "cuda" trains 3 steps; the GPU has finished step 0's all-reduce by step 1's end, not
    # steps 1 and 2's by the end of training. Every step must have its buckets and its comm_volume
    # once the process exits (`StepTracker.close` drains), and no event is waited for before that.
    from types import SimpleNamespace

    from ddpviz.engine.attach.ddp import Watch

    s, sink = _session(tmp_path)
    watch = Watch.__new__(Watch)  # the CUDA bookkeeping alone: no DDP, no GPU
    watch.s, watch.device, watch.ddp_index, watch.world_size, watch.param_bytes = s, torch.device("cuda", 0), 0, 2, 64
    watch.state = SimpleNamespace(recorder=FakeRecorder())
    watch.layouts, watch.deferred, watch.volume = [], [], VolumeBook(s)
    events: list[FakeEvent] = []
    for step in range(3):
        marks = [FakeEvent() for _ in range(4)]
        events += marks
        watch.state.recorder.origin = marks[0]
        watch.state.recorder.records = [dict(nbytes=64, ready=marks[1], comm_start=marks[2], comm_end=marks[3])]
        if step == 1:
            for m in events[:4]:
                m.done = True  # step 0's work has completed on the GPU
        assert watch.buckets(step) == []
        watch.volume.close(step)
    emitted = lambda t: sorted(e["step"] for e in sink.events if e["type"] == t)  # noqa: E731
    assert emitted("bucket") == emitted("comm_volume") == [0]
    assert sum(m.waits for m in events) == 0  # training never waited for the GPU
    tracker = StepTracker(s)
    tracker.watches.append(watch)
    tracker.close()
    assert emitted("bucket") == emitted("comm_volume") == [0, 1, 2]
