"""Single and DDP time a step with one synchronize (engine.measure.clocks.StepClock).

On CUDA a phase mark is an event, readable only once the work before it has completed
(`torch.cuda.Event.elapsed_time` raises before then), and each `torch.cuda.synchronize` stalls
the host's queueing of the next step. `StrictClock` holds the CPU run to the CUDA contract: a
mark read before the step's `settle` raises, and every settle is counted.
"""

import os
import socket
import time

import pytest
import torch

from ddpviz.engine.config import RunConfig
from ddpviz.engine.events import ListSink


class StrictClock:
    """StepClock's interface with CUDA's rule made explicit (host-clock readings underneath)."""

    made: list["StrictClock"] = []

    def __init__(self, device):
        self.settles, self.reads, self.pending = 0, 0, []
        StrictClock.made.append(self)

    def mark(self):
        m = {"t": time.perf_counter(), "settled": False}
        self.pending.append(m)
        return m

    def settle(self):
        self.settles += 1
        for m in self.pending:
            m["settled"] = True
        self.pending = []

    def seconds(self, origin, mark):
        if not (origin["settled"] and mark["settled"]):
            raise RuntimeError("a mark was read before the step's synchronize")
        self.reads += 1
        return mark["t"] - origin["t"]


CFG = dict(world_size=1, steps=5, global_batch_size=32, eval_every=0, step_delay_s=0.0, probe=False, grad_accum_steps=2)


def check_steps(events, steps):
    rows = [e for e in events if e["type"] == "step"]
    assert [e["step"] for e in rows] == list(range(steps))
    for e in rows:  # every phase measured, inside the step's own wall time
        assert e["forward_s"] > 0 and e["backward_s"] > 0 and e["optimizer_s"] > 0
        assert e["forward_s"] + e["backward_s"] + e["comm_exposed_s"] + e["optimizer_s"] <= e["step_time_s"]


def test_single_settles_once_per_step_and_reads_marks_only_after(monkeypatch):
    import ddpviz.engine.modes.single as single
    from ddpviz.engine.run import run_training

    StrictClock.made = []
    monkeypatch.setattr(single, "StepClock", StrictClock)
    sink = ListSink()
    result = run_training(RunConfig(mode="single", **CFG), sink, "clock")
    assert result.status == "succeeded", result.error
    (clock,) = StrictClock.made
    assert clock.settles == CFG["steps"]
    check_steps(sink.events, CFG["steps"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ddp_rank_settles_once_per_step_and_reads_marks_only_after(monkeypatch, tmp_path):
    """One gloo rank in this process (world_size 1: DDP, its comm hook and buckets all run)."""
    import torch.distributed as dist

    import ddpviz.engine.modes.ddp.rank as ddp_rank
    from ddpviz.engine.modes.ranks import leave_process_group

    StrictClock.made = []
    monkeypatch.setattr(ddp_rank, "StepClock", StrictClock)
    for k, v in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(_free_port())).items():
        monkeypatch.setitem(os.environ, k, v)
    threads, sink = torch.get_num_threads(), ListSink()
    try:
        ddp_rank._train_rank(RunConfig(mode="ddp", bucket_cap_mb=0.01, **CFG), "clock", 0, tmp_path, "gloo", "cpu",
                             sink, "")
    finally:
        if dist.is_initialized():
            leave_process_group()
        torch.set_num_threads(threads)
    (clock,) = StrictClock.made
    assert clock.settles == CFG["steps"]
    check_steps(sink.events, CFG["steps"])
    buckets = [e for e in sink.events if e["type"] == "bucket" and e["step"] == CFG["steps"] - 1]
    assert len(buckets) >= 2 and all(0 <= b["ready_s"] <= b["comm_start_s"] <= b["comm_end_s"] for b in buckets)
