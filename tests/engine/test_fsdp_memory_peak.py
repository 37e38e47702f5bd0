"""FSDP's reported peak against PyTorch's own CPU allocator on plain `fully_shard` (issue 20, item 1).

The config of the issue's finding: mlp 64 -> 512 x3 -> 10 on digits, AdamW, global batch 1024,
2 gloo ranks. ddpviz's per-rank peak (the ledger over each traced step, `memory` events) must
be within 10% of the peak c10's allocator reports for the same model, optimizer and batch
(`tests/engine/fsdp_memory_reference.py`, which shares no code with the ledger). The hook-time
samples it replaced reported 7.4-8.4 MiB against the allocator's ~10.4 MiB.
"""

import pytest
import runs

from ddpviz.engine.config import RunConfig
from ddpviz.engine.events import ListSink
from ddpviz.engine.run import run_training
from ddpviz.engine.summary import SummaryBuilder

pytestmark = pytest.mark.slow
FIELDS = dict(mode="fsdp", model="mlp", width=512, depth=3, world_size=2, global_batch_size=1024, steps=4,
              optimizer="adamw", lr=1e-3, eval_every=0, step_delay_s=0)


@pytest.fixture(scope="module")
def run():
    return runs.train(RunConfig(**FIELDS), "fsdp-peak")[1]


def test_fsdp_peak_per_rank_is_the_allocators_peak_over_the_whole_step(run, tmp_path):
    from tests.engine.fsdp_memory_reference import allocator_peaks

    reference = allocator_peaks(RunConfig(**FIELDS), str(tmp_path))
    summary = SummaryBuilder()
    for e in run.events:
        summary.observe(e)
    peaks = summary.summary()["peak_memory_bytes"]
    assert len(peaks) == 2
    for rank in (0, 1):
        mem = [e for e in run.of_type("memory") if e["rank"] == rank]
        assert sorted(e["step"] for e in mem) == list(range(FIELDS["steps"]))  # every step traced
        # The allocator's own peak of the same step moves with scheduling: FSDP2's reduce-scatters
        # on gloo run beside backward, and how long their buffers overlap the gradients still being
        # made changes from step to step (4 reference runs, 2026-12-04, steps 1-3 in MiB: 10.4,
        # 11.03, 11.4 in every run, once 12.03 in CI; the ledger said 10.40 each time). So ours must
        # lie within 10% of the range the allocator itself shows over the steps after the first
        # (whose AdamW state is made inside it): below its least, as the hook-time samples did
        # (7.4-8.4 MiB), or above its most, is red.
        ours, steady = peaks[mem[0]["device"]], reference[rank][1:]
        lo, hi = min(steady) * 0.90, max(reference[rank]) * 1.10
        assert lo <= ours <= hi, (rank, ours / 2**20, [r / 2**20 for r in reference[rank]])


def test_steps_that_traced_memory_are_left_out_of_the_throughput_medians():
    """Item 7: a step with a `memory` event paid for the tracing; the medians must not use it."""
    from ddpviz.engine.summary import run_steps, steady_steps

    sink = ListSink()
    cfg = RunConfig(**{**FIELDS, "width": 16, "depth": 1, "global_batch_size": 32, "steps": 55})
    assert run_training(cfg, sink, "fsdp-medians").status == "succeeded"
    traced = {e["step"] for e in sink.of_type("memory")}
    assert {0, 1, 2, 54} <= traced and len(traced) < 10
    used = {r["step"] for r in steady_steps(run_steps(sink.of_type("step")))}
    assert used and not used & traced
    assert len(used) == 55 - 3 - len(traced - {0, 1, 2})  # only warm-up and traced steps left out
