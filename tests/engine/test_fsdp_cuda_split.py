"""FSDP's step split where the host clock cannot see the comm streams (CUDA), run on CPU (issue 20, item 4).

The branch is chosen by `StepRunner.host_clock` (False on CUDA); a spawned one-rank gloo process
builds a real FSDP2 model and runner and flips it, the fake. The step must then report exposed
comm as null with `comm_exposed_measured: false` — not a measured-looking 0 — and its forward and
backward as the passes' whole wall times (nothing subtracted), by the step's own `phase_spans`.
"""

import os

import pytest

pytestmark = pytest.mark.slow
FIELDS = dict(mode="fsdp", model="mlp", width=32, depth=2, world_size=1, global_batch_size=32, steps=4,
              optimizer="adamw", lr=1e-3, eval_every=0, step_delay_s=0)


def _worker(_i, store_path, q):
    import time

    import torch
    import torch.distributed as dist

    from ddpviz.engine.config import RunConfig
    from ddpviz.engine.data import load_dataset
    from ddpviz.engine.events import ListSink
    from ddpviz.engine.measure.clocks import HostClock
    from ddpviz.engine.measure.telemetry import Telemetry
    from ddpviz.engine.models import build_model
    from ddpviz.engine.modes.fsdp.collectives import CollectiveLog, install_recorders
    from ddpviz.engine.modes.fsdp.memory import FsdpMemoryProbe
    from ddpviz.engine.modes.fsdp.rank import shard_model
    from ddpviz.engine.modes.fsdp.step import StepRunner
    from ddpviz.engine.components.training import make_optimizer

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=0, world_size=1)
    cfg = RunConfig(**FIELDS)
    ds, device = load_dataset(cfg), torch.device("cpu")
    model = build_model(cfg, ds)
    units = shard_model(model, cfg, device)
    log = CollectiveLog(HostClock())
    install_recorders(units, log)
    opt = make_optimizer(cfg, model.parameters())
    sink = ListSink()
    tel = Telemetry(sink, "fake-cuda")
    runner = StepRunner(cfg, 0, 1, "gloo", device, ds, model, units, opt, log, FsdpMemoryProbe(model, opt, device),
                        tel, {})
    runner.host_clock = False  # what a CUDA device sets: collectives on FSDP2's streams

    class CountingClock:  # host marks, as CPU's; counts the step's waits for the device
        settles = 0

        def mark(self):
            return time.perf_counter()

        def seconds(self, a, b):
            return b - a

        def settle(self):
            CountingClock.settles += 1

    syncs = []
    torch.cuda.synchronize = lambda *a, **k: syncs.append(a)  # any direct wait besides the clock's
    runner.clock = CountingClock()
    steps = [runner.train_step(step) for step in range(cfg.steps)]
    q.put(dict(steps=steps, settles=CountingClock.settles, syncs=len(syncs)))


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    from ref_procs import run_reference

    store = os.path.join(tmp_path_factory.mktemp("pg"), "store")
    return run_reference(_worker, (store,), nprocs=1, results=1)[0]


def test_a_cuda_step_waits_for_the_device_once(steps):
    """One `StepClock.settle` a step (a synchronize on CUDA), no other synchronize, and no loss read before it:
    the step used to synchronise after its forward, its backward and its optimizer, and read each micro-batch's
    loss with `.item()`."""
    assert steps["settles"] == len(steps["steps"]) == FIELDS["steps"] and steps["syncs"] == 0


def test_exposed_comm_is_null_and_said_not_measured(steps):
    for s in steps["steps"]:
        assert s["comm_exposed_s"] is None and s["comm_exposed_measured"] is False


def test_forward_and_backward_are_the_passes_whole_wall_times(steps):
    for s in (s for s in steps["steps"] if s.get("phase_spans")):
        spans = {p["phase"]: p["end_s"] - p["start_s"] for p in s["phase_spans"]}
        assert s["forward_s"] == pytest.approx(spans["forward"], rel=1e-9)
        assert s["backward_s"] == pytest.approx(spans["backward"], rel=1e-9)
