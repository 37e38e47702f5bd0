"""Live memory is live (issue 20, item 8): the memory timer's readings reach the run's events as
they are taken — at least 10 per second per device over a run with 0.5 s steps, each at most
1 s after it was taken — in every mode that runs on CPU.

Counted here from the events themselves (the readings' own timestamps against the steps' own
start and end), not with the bench's or the doctor's counter; arrival times are stamped by this
test's sink as each event reaches it.

`quiet`: a reading's lateness is how soon the timer thread gets a CPU and the GIL; with the suite's
4 xdist workers on 2 cores, one DP batch once arrived 1.08 s after its oldest reading (CI,
2026-12-03), so `make test` runs these alone, after the parallel run."""

import time
from collections import defaultdict

import pytest

from ddpviz.engine.config import RunConfig
from ddpviz.engine.events import CallbackSink
from ddpviz.engine.run import run_training

pytestmark = pytest.mark.quiet
STEP_S = 0.5
MIN_PER_S = 10.0  # the floor; the timer reads 20 times a second
MAX_LATE_S = 1.0


def _run(mode, world_size):
    arrived = []
    sink = CallbackSink(lambda e: arrived.append((time.time(), e)))
    cfg = RunConfig(mode=mode, world_size=world_size, steps=5, step_delay_s=STEP_S, device="cpu",
                    model="mlp", dataset="digits", eval_every=0, probe=False)
    result = run_training(cfg, sink, f"mem-{mode}")
    assert result.status == "succeeded", result.error
    return arrived


@pytest.mark.parametrize("mode,world_size", [("single", 1), ("dp", 2),
                                             pytest.param("ddp", 2, marks=pytest.mark.slow),
                                             pytest.param("fsdp", 2, marks=pytest.mark.slow)])
def test_each_device_publishes_ten_readings_a_second_each_within_a_second(mode, world_size):
    arrived = _run(mode, world_size)
    steps = [e for _, e in arrived if e["type"] == "step"]
    start = min(e["start_ts"] for e in steps)
    end = max(e["start_ts"] + e["step_time_s"] for e in steps)
    assert end - start >= 4 * STEP_S  # the delays between steps are in the span
    taken = defaultdict(list)
    late = []
    for at, e in arrived:
        if e["type"] != "memory_readings":
            continue
        assert len(e["reading_ts"]) == len(next(iter(e["bytes"].values())))
        assert all(b > 0 for b in e["bytes"]["process"]), "RSS readings are bytes the process holds"
        taken[e["device"]] += [t for t in e["reading_ts"] if start <= t <= end]
        late += [at - t for t in e["reading_ts"]]
    devices = {e["device"] for _, e in arrived if e["type"] == "step"} if mode != "dp" else \
        {f"cpu:{i}" for i in range(world_size)}
    assert set(taken) == devices
    for device, ts in taken.items():
        assert len(set(ts)) == len(ts), "each reading is published once"
        assert len(ts) / (end - start) >= MIN_PER_S, (device, len(ts), end - start)
    assert max(late) <= MAX_LATE_S
