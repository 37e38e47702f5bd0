"""A DDP rank on CUDA reads its ordinary steps once their events completed, never synchronising (issue 31.2):
`engine.measure.deferred.DeferredSteps` in `drive`, and the rank's deferred path run on CPU (its CPU twin,
`DDPVIZ_DEFER_CPU_STEPS=1`) with a step clock whose marks complete only some marks later, as a GPU behind the
host does, and which counts every synchronize and fails a read of an incomplete mark."""

from __future__ import annotations

import math
import os
import socket
import time

import pytest
import torch

from ddpviz.engine.components.loop import NonFiniteLoss, drive
from ddpviz.engine.config import RunConfig
from ddpviz.engine.events import ListSink
from ddpviz.engine.measure.deferred import DEFERRED_STEP_TIME, DeferredSteps, StepLate
from ddpviz.engine.measure.telemetry import Telemetry


class Late:
    """A step whose figures complete after `polls` readiness checks (a GPU that is behind)."""

    def __init__(self, polls: int):
        self.polls, self.checks, self.reads = polls, 0, 0

    def ready(self) -> bool:
        self.checks += 1
        return self.checks > self.polls

    def read(self, fields: dict):
        def read() -> dict:
            assert self.checks > self.polls, "read before its marks completed"
            self.reads += 1
            return fields
        return read


def _fields(loss: float = 1.0) -> dict:
    return dict(loss=loss, samples=8, step_time_s=0.01)


def _drive(steps: int, train_step, later: DeferredSteps) -> list[tuple]:
    sent: list[tuple] = []
    cfg = RunConfig(steps=steps, eval_every=0, step_delay_s=0.0, probe=False)
    try:
        drive(cfg, Telemetry(ListSink(), "late"), train_step, later=later,
              emit_step=lambda step, fields: sent.append((step, fields["loss"])))
    finally:
        sent.append(("end", None))
    return sent


def test_drive_sends_each_late_step_once_it_completed_in_order_and_all_before_a_step_read_at_once():
    """Steps 0-5 come late (each complete after 2 checks, so a step or two after it ended); step 6 returns its
    fields at once (its synchronize completed everything): every queued step is sent before it; 7-9 late again,
    the rest sent after the last step. Each step's figures are read once, after they completed."""
    later, lates = DeferredSteps(), {}

    def train_step(step: int):
        if step == 6:
            return _fields(6.0)
        lates[step] = late = Late(polls=2)
        later.add(step, late.ready, late.read(_fields(float(step))))
        return None

    sent = _drive(10, train_step, later)
    assert [s for s, _ in sent] == [*range(10), "end"]
    assert [loss for _, loss in sent[:10]] == [float(s) for s in range(10)]
    assert all(late.reads == 1 for late in lates.values())
    # not at once: step 0 completed on its 3rd check, after steps 1 and 2 had ended (one check per step end)
    assert lates[0].checks == 3 and len(later) == 0


def test_sent_before_a_nonfinite_late_step_are_exactly_the_steps_before_it():
    later, sent = DeferredSteps(), []

    def train_step(step: int):
        late = Late(polls=1)
        later.add(step, late.ready, late.read(_fields(math.nan if step == 4 else float(step))))
        return None

    cfg = RunConfig(steps=12, eval_every=0, step_delay_s=0.0, probe=False)
    with pytest.raises(NonFiniteLoss) as err:
        drive(cfg, Telemetry(ListSink(), "late"), train_step, later=later,
              emit_step=lambda step, fields: sent.append(step))
    assert err.value.step == 4
    assert sent == [0, 1, 2, 3, 4]  # step 4's event is sent, then the run fails there


def test_a_failing_step_cancel_and_evaluation_leave_every_earlier_step_sent_first(monkeypatch):
    """The steps queued before a step that raises are still sent (once they completed, waiting at most
    FAULT_WAIT_S), before the error; a cancel sends them before `Canceled`; an evaluation's events come after its
    step's (the rank's `eval` and replica `sync` events follow their step)."""
    import ddpviz.engine.components.loop as loop

    def run(steps: int, fail_at: int | None = None, stop_at: int | None = None, stuck: int | None = None,
            eval_every: int = 0) -> tuple[list, BaseException | None]:
        later, log = DeferredSteps(), []

        def train_step(step: int):
            if step == fail_at:
                raise RuntimeError("boom")
            late = Late(polls=10 ** 9 if step == stuck else 3)
            later.add(step, late.ready, late.read(_fields(float(step))))
            return None

        cfg = RunConfig(steps=steps, eval_every=eval_every, step_delay_s=0.0, probe=False)
        try:
            drive(cfg, Telemetry(ListSink(), "late"), train_step, later=later,
                  should_stop=lambda: len([x for x in log if x[0] == "train"]) == stop_at if stop_at else False,
                  evaluate=lambda: log.append(("eval", None)) or (0.0, 1.0),
                  emit_step=lambda step, fields: log.append(("step", step)))
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            return log, exc
        return log, None

    log, exc = run(12, fail_at=5)
    assert str(exc) == "boom" and exc.step == 5 and log == [("step", s) for s in range(5)]
    monkeypatch.setattr(loop, "FAULT_WAIT_S", 0.05)
    log, exc = run(12, fail_at=5, stuck=3)  # step 3 never completes: 0-2 sent, then the step's own error
    assert str(exc) == "boom" and exc.step == 5 and log == [("step", s) for s in range(3)]
    log, exc = run(6, eval_every=3)
    assert exc is None and log == [("step", 0), ("step", 1), ("step", 2), ("eval", None),
                                   ("step", 3), ("step", 4), ("step", 5), ("eval", None)]


def test_cancel_sends_the_queued_steps_first():
    from ddpviz.engine.components.loop import Canceled

    later, sent, calls = DeferredSteps(), [], []

    def train_step(step: int):
        calls.append(step)
        late = Late(polls=3)
        later.add(step, late.ready, late.read(_fields(float(step))))
        return None

    cfg = RunConfig(steps=12, eval_every=0, step_delay_s=0.0, probe=False)
    with pytest.raises(Canceled):
        drive(cfg, Telemetry(ListSink(), "late"), train_step, later=later, should_stop=lambda: len(calls) == 6,
              emit_step=lambda step, fields: sent.append(step))
    assert sent == list(range(6))


def test_flush_sends_the_queued_steps_in_order_before_a_step_that_synchronised():
    """A step read at once (it synchronised) flushes the queue before it computes anything that compares with
    the steps before it (a DDP rank's comm_volume): their events first, in order."""
    later, log = DeferredSteps(), []

    def train_step(step: int):
        if step == 4:
            later.flush()
            log.append(("computed", 4))
            return _fields(4.0)
        late = Late(polls=10)
        later.add(step, late.ready, late.read(_fields(float(step))))
        return None

    cfg = RunConfig(steps=6, eval_every=0, step_delay_s=0.0, probe=False)
    drive(cfg, Telemetry(ListSink(), "late"), train_step, later=later,
          emit_step=lambda step, fields: log.append(("step", step)))
    assert log == [("step", 0), ("step", 1), ("step", 2), ("step", 3), ("computed", 4), ("step", 4),
                   ("step", 5)]


def test_a_step_that_never_completes_is_a_visible_error_not_a_hang():
    later = DeferredSteps(timeout_s=0.05)
    later.add(3, lambda: False, lambda: _fields())
    t0 = time.monotonic()
    with pytest.raises(StepLate, match="step 3") as err:
        list(later.rest())
    assert err.value.step == 3 and time.monotonic() - t0 < 2


def test_add_waits_for_the_oldest_only_beyond_max_pending():
    later = DeferredSteps(max_pending=2)
    first, second, third = Late(polls=50), Late(polls=50), Late(polls=5)
    later.add(0, first.ready, first.read(_fields()))
    later.add(1, second.ready, second.read(_fields()))
    assert first.checks == 0  # two queued: no wait
    later.add(2, third.ready, third.read(_fields()))
    assert first.checks == 51 and second.checks == 0  # the third waited (polling) for the oldest only
    assert [s for s, _ in later.completed()] == [0]  # step 1 still incomplete: nothing after it either
    assert len(later) == 2


def test_the_hook_recorder_keeps_a_taken_backward_from_the_next_one():
    """`BucketRecorder.taken` resolves the records of the backward it was taken in, after the next backward
    began (a late step's buckets are read a step or more after it ended)."""
    from ddpviz.engine.modes.ddp.comm_hook import BucketRecorder

    rec = BucketRecorder(1, True, {})
    rec.begin_backward()
    rec.records.append(dict(bucket_index=0, nbytes=64, is_last=True, ready=rec.origin + 0.25))
    first = rec.taken()
    rec.begin_backward()
    rec.records.append(dict(bucket_index=0, nbytes=128, is_last=True, ready=rec.origin + 0.5))
    (row,) = first()
    assert row["nbytes"] == 64 and row["ready_s"] == pytest.approx(0.25)
    assert rec.resolved()[0]["nbytes"] == 128


class LateClock:
    """StepClock's interface as a GPU behind the host keeps it: a mark completes once `LAG` more marks were
    made (by any LateClock: one device's stream) or at a synchronize (`settle`, counted: it completes every
    mark made so far, the bucket recorder's too); reading an incomplete mark raises (CUDA's elapsed_time
    does); `done` says whether it completed without waiting (`Event.query`). `reset()` before each run."""

    LAG = 12  # more than one step's own marks (9 with two micro-batches): each step completes during the next
    made: list["LateClock"] = []
    count = synced = 0  # marks made on the stream, and made before the last synchronize

    @classmethod
    def reset(cls) -> None:
        cls.made, cls.count, cls.synced = [], 0, 0

    def __init__(self, device=None):
        self.settles, self.done_checks = 0, 0
        LateClock.made.append(self)

    def mark(self):
        LateClock.count += 1
        return {"t": time.perf_counter(), "n": LateClock.count}

    def _complete(self, mark) -> bool:
        return mark["n"] <= LateClock.synced or LateClock.count - mark["n"] >= self.LAG

    def done(self, mark) -> bool:
        self.done_checks += 1
        return self._complete(mark)

    def settle(self):
        self.settles += 1
        LateClock.synced = LateClock.count

    def seconds(self, origin, mark):
        if not (self._complete(origin) and self._complete(mark)):
            raise RuntimeError("a mark was read before it completed")
        return mark["t"] - origin["t"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("bucket_timing", ["hook", "recorder"])
def test_the_ddp_rank_on_its_cuda_path_synchronises_only_on_its_instrumented_steps(monkeypatch, tmp_path,
                                                                                    bucket_timing):
    """One gloo rank in this process, its steps read as on CUDA (`DDPVIZ_DEFER_CPU_STEPS`): only the steps
    that are marked instrumented (metered: `gil` event; memory-traced; the last) synchronise; every other step
    is read later, once its marks completed, and says so; every step is sent, in order, buckets first. The
    hook's bucket marks are late too: a late step resolving the next backward's records would read marks
    that have not completed (and raise)."""
    import torch.distributed as dist

    import ddpviz.engine.modes.ddp.rank as ddp_rank
    from ddpviz.engine.modes.ranks import leave_process_group

    LateClock.reset()
    monkeypatch.setattr(ddp_rank, "StepClock", LateClock)
    monkeypatch.setattr(ddp_rank, "HostClock", LateClock)  # the hook's bucket marks late too, on the same stream
    for k, v in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(_free_port()), DDPVIZ_DEFER_CPU_STEPS="1").items():
        monkeypatch.setitem(os.environ, k, v)
    steps, threads, sink = 20, torch.get_num_threads(), ListSink()
    cfg = RunConfig(mode="ddp", world_size=1, steps=steps, global_batch_size=32, eval_every=0, step_delay_s=0.0,
                    probe=False, grad_accum_steps=2, bucket_cap_mb=0.01, bucket_timing=bucket_timing)
    try:
        ddp_rank._train_rank(cfg, "late", 0, tmp_path, "gloo", "cpu", sink, "")
    finally:
        if dist.is_initialized():
            leave_process_group()
        torch.set_num_threads(threads)
    bucket_clock, clock = LateClock.made  # the recorder's, then the step's (rank.py makes them in this order)
    assert bucket_clock.settles == 0 and clock.settles > 0
    events = [e for e in sink.events if e["type"] in ("step", "bucket")]
    rows = [e for e in events if e["type"] == "step"]
    assert [e["step"] for e in rows] == list(range(steps))
    metered = {e["step"] for e in sink.events if e["type"] == "gil"}
    instrumented = {e["step"] for e in rows if e.get("memory_traced")} | metered | {steps - 1}
    late = {e["step"] for e in rows if e.get("step_time_source") == DEFERRED_STEP_TIME}
    assert len(late) >= 5 and late == set(range(steps)) - instrumented
    assert clock.settles == len(instrumented)  # red if an ordinary step synchronises
    assert clock.done_checks >= len(late)
    for e in rows:  # every phase measured, inside the step's time
        assert e["forward_s"] > 0 and e["backward_s"] >= 0 and e["optimizer_s"] > 0
        assert e["forward_s"] + e["backward_s"] + e["comm_exposed_s"] + e["optimizer_s"] <= e["step_time_s"] + 1e-9
    # buckets of a step come right before its step event: steps in order
    order = [(e["step"], e["type"] == "step") for e in events]
    assert order == sorted(order)
    for step in late:
        buckets = [e for e in events if e["type"] == "bucket" and e["step"] == step]
        assert len(buckets) >= 2 and sum(b["nbytes"] for b in buckets) > 0
        if bucket_timing == "hook":  # the late step's own records, with times inside its backward
            assert all(0 <= b["ready_s"] <= b["comm_start_s"] <= b["comm_end_s"] for b in buckets)


def test_the_single_baseline_on_its_cuda_path_synchronises_only_on_its_traced_steps(monkeypatch):
    """The single-device baseline reads its ordinary steps late as a DDP rank does (so a speed-up against it is
    not the instrument's): only the memory-traced steps (0-2, the last) synchronise; the others are read once
    their marks completed, and train to the same losses as the same run read at once."""
    import ddpviz.engine.modes.single as single
    from ddpviz.engine.run import run_training

    cfg = RunConfig(mode="single", world_size=2, steps=12, global_batch_size=32, eval_every=0, step_delay_s=0.0,
                    probe=False, grad_accum_steps=2)
    at_once = ListSink()
    assert run_training(cfg, at_once, "at-once").status == "succeeded"
    LateClock.reset()
    monkeypatch.setattr(single, "StepClock", LateClock)
    monkeypatch.setitem(os.environ, "DDPVIZ_DEFER_CPU_STEPS", "1")
    sink = ListSink()
    result = run_training(cfg, sink, "late")
    assert result.status == "succeeded", result.error
    (clock,) = LateClock.made
    rows = [e for e in sink.events if e["type"] == "step"]
    assert [e["step"] for e in rows] == list(range(cfg.steps))
    traced = {e["step"] for e in rows if e.get("memory_traced")}
    late = {e["step"] for e in rows if e.get("step_time_source") == DEFERRED_STEP_TIME}
    assert traced == {0, 1, 2, cfg.steps - 1} and late == set(range(cfg.steps)) - traced
    assert clock.settles == len(traced)
    assert [e["loss"] for e in rows] == [e["loss"] for e in at_once.events if e["type"] == "step"]
