"""The parts of `ddpviz doctor --gpu`'s probes and of the overhead measurement that run on CPU,
against hand-worked values and against each other (engine/harness/gpu_checks.py, engine/harness/overhead.py)."""

import os
import pytest

from ddpviz.engine.config import RunConfig
from ddpviz.engine.harness.gpu_checks import memory_imbalance, shared_gpu_ddp
from ddpviz.engine.harness.overhead import block_medians, measure_overhead, median_interval, turn_order


def test_memory_imbalance_takes_each_devices_peak():
    events = [{"type": "memory", "device": "cuda:0", "peak_allocated_bytes": 300, "allocated_bytes": 100},
              {"type": "memory", "device": "cuda:0", "peak_allocated_bytes": 240},
              {"type": "memory", "device": "cuda:1", "allocated_bytes": 200}]
    out = memory_imbalance(events)
    assert out == {"peak_bytes": {"cuda:0": 300, "cuda:1": 200}, "max_over_min": 1.5}


def test_block_medians_by_hand():
    # two 5-step blocks; block 1 intervals 1, 2, 1, 2 -> first dropped -> 2, 1, 2: median 2;
    # block 2 (starts 100 s later: the wait is not an interval) 3, 1, 1, 4 -> 1, 1, 4: median 1
    starts = [0, 1, 3, 4, 6, 100, 103, 104, 105, 109]
    assert block_medians(starts, 5) == [2, 1]
    with pytest.raises(ValueError, match="whole number of 4-step blocks"):
        block_medians(starts, 4)
    with pytest.raises(ValueError, match="block_steps must be >= 4"):
        block_medians(starts[:6], 3)


def test_turn_order_is_abba_with_as_many_blocks_each():
    assert turn_order(3) == ["plain", "ddpviz", "ddpviz", "plain", "plain", "ddpviz"]


def test_median_interval_brackets_the_median_and_narrows_with_agreement():
    spread = [0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5]
    lo, hi = median_interval(spread)
    assert lo <= 1.2 <= hi and lo >= 0.9 and hi <= 1.5 and hi > lo
    assert median_interval([1.05] * 7) == [1.05, 1.05]


@pytest.mark.slow
def test_shared_device_ddp_harness_records_every_gradient_byte_in_its_buckets():
    """The recording hook's buckets of each step hold every gradient once: their bytes add up to
    the model's parameters x 4 B (float32), counted here by PyTorch on a model of the harness's
    config. On CPU the harness measures no memory and says so (no formula called memory)."""
    from ddpviz.engine.config import RunConfig
    from ddpviz.engine.data import load_dataset
    from ddpviz.engine.models import build_model

    cfg = RunConfig(mode="ddp", model="gpt", dataset="text", width=128, depth=4, n_head=4, block_size=64,
                    world_size=2, global_batch_size=16, bucket_cap_mb=0.25)  # the harness's (gpu_checks)
    grad_bytes = 4 * sum(p.numel() for p in build_model(cfg, load_dataset(cfg)).parameters() if p.requires_grad)
    out = shared_gpu_ddp(world=2, steps=3, device_kind="cpu")
    assert [r["rank"] for r in out["ranks"]] == [0, 1] and not any("error" in r for r in out["ranks"])
    for r in out["ranks"]:
        assert len(r["steps"]) == 3
        for step in r["steps"]:
            assert sum(b["nbytes"] for b in step["buckets"]) == grad_bytes
            assert all(0 <= b["ready_s"] <= b["comm_start_s"] <= b["comm_end_s"] for b in step["buckets"])
        assert len(r["steps"][-1]["buckets"]) >= 2  # bucket_cap 0.25 MiB on a ~0.8 MiB GPT
        memory = r["steps"][-1]["memory"]
        assert memory["allocated_bytes"] is None and memory["source"].startswith("not measured")
    sums = out["ranks"][0]["checksums"]
    assert sums[0] == sums[1]  # both ranks hold the same parameters after the all-reduced steps


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_overhead_sides_take_turns_and_do_the_same_work_on_gloo():
    """Both sides run at once but train in turns: no step of one side starts inside a block of
    the other (the controller's own log of each block's release and end), in ABBA order, and
    both end with the same parameters (the same work: gradient pre-division in ddpviz's hook
    against DDP's built-in averaging)."""
    import time

    cfg = RunConfig(world_size=2, steps=6, global_batch_size=64, bucket_cap_mb=0.05)
    t0 = time.time()
    out = measure_overhead(cfg, rounds=2, block_steps=4, warmup_blocks=1)
    assert out["backend"] == "gloo" and out["device_kind"] == "cpu"
    assert out["config"]["steps"] == 12  # (1 warm-up + 2 rounds) x 4
    assert out["max_param_diff"] <= 1e-6  # plain and ddpviz DDP trained identically
    sched = out["schedule"]
    assert [s[0] for s in sched] == turn_order(3)
    assert all(t0 < a[1] < a[2] <= b[1] for a, b in zip(sched, sched[1:]))  # one block at a time
    for side in ("plain", "ddpviz"):  # each side's steps started inside its own turns only
        windows = [s[1:] for s in sched if s[0] == side]
        spans = out["block_spans"][side]
        assert len(spans) == len(windows) == 3
        assert all(w0 <= first <= last <= w1 for (first, last), (w0, w1) in zip(spans, windows))
    assert len(out["rounds"]) == 2
    ratios = sorted(r["ratio"] for r in out["rounds"])
    assert out["ratio"] == pytest.approx(sum(ratios) / 2)  # the median of two rounds
    for r in out["rounds"]:
        assert r["ratio"] == pytest.approx(r["ddpviz_median_step_s"] / r["plain_median_step_s"])
    # the counted ddpviz blocks are steps 4-7 and 8-11: 12 steps trace 0-2 and the last (11); the meter reads
    # the first 8 steps, then one in 32 (engine.measure.gil.MeterGate), so 4-7 only
    assert [(r["ddpviz_traced_steps"], r["ddpviz_metered_steps"]) for r in out["rounds"]] == \
        [([], [4, 5, 6, 7]), ([11], [])]
    assert out["rounds_untraced"] == 1 and out["ratio_untraced"] == out["rounds"][0]["ratio"]
    # ddpviz's own step time over a block's plain steps: block 1's are all metered (none), block 2's are 8, 9, 10
    assert out["rounds"][0]["ddpviz_own_step_s"] is None and 0 < out["rounds"][1]["ddpviz_own_step_s"] < 1
    from ddpviz.engine.harness.overhead import own_step_time
    assert own_step_time([0, 1, 2, 3, 4, 5], [0.5, 1.1, 2.3, 3.7, 4.2, 5.9], dict(traced={1}, metered={4}), 0, 6) \
        == pytest.approx(0.6)  # by hand: steps 0, 2, 3, 5 take 0.5, 0.3, 0.7, 0.9 s; their median 0.6
    # a last block cut short (steps 4-5 of a block of 4 from step 4): its steps there, 4 metered: step 5's 0.9 s
    assert own_step_time([0, 1, 2, 3, 4, 5], [0.5, 1.1, 2.3, 3.7, 4.2, 5.9], dict(traced=set(), metered={4}), 1, 4) \
        == pytest.approx(0.9)
    with pytest.raises(ValueError, match="block_steps must be >= 4"):
        measure_overhead(cfg, rounds=1, block_steps=3)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_overhead_ends_with_the_side_that_failed_and_leaves_no_rank_behind():
    """A ddpviz rank that raises in its second block: the measurement raises the ddpviz side's
    error (not a hang at the turn gate), and no rank process of either side is left."""
    import psutil

    cfg = RunConfig(world_size=2, steps=12, global_batch_size=64, fault="raise", fault_rank=1, fault_step=6)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(RuntimeError, match="ddpviz side failed.*injected fault"):
        measure_overhead(cfg, rounds=2, block_steps=4, warmup_blocks=1)
    import time

    deadline = time.time() + 30
    while time.time() < deadline:
        left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE
                and not (p.ppid() == os.getpid()  # the rank fork server and multiprocessing's resource
                         # tracker live with this process (the tracker starts with the first test that
                         # needs it: this one, when it runs alone)
                         and any(m in " ".join(p.cmdline()) for m in ("multiprocessing.forkserver",
                                                                       "multiprocessing.resource_tracker")))]
        if not left:
            break
        time.sleep(0.5)
    assert not left, f"processes left: {[p.cmdline()[:3] for p in left]}"


@pytest.mark.slow
def test_the_attach_sync_probe_passes_instrumented_ddp_and_fails_one_synchronize_a_step():
    """`ddpviz doctor --gpu`'s attach_adds_no_sync check, on CPU (gloo): the instrumented process
    records every step and each step's buckets, and its verdict against the plain loop passes;
    an instrumentation that synchronised once a step (the probe's `extra_sync`) is named."""
    from ddpviz.engine.harness.attach_sync import attach_sync_probe, attach_sync_verdict

    plain = attach_sync_probe("cpu", steps=8, instrumented=False)
    attached = attach_sync_probe("cpu", steps=8)
    assert plain["step_events"] == 0 and plain["bucket_steps"] == []  # nothing instruments the reference
    assert attached["step_events"] == 8 and attached["bucket_steps"] == list(range(8))
    assert attached["bucket_devices"] == ["cpu:0"]
    ok, why = attach_sync_verdict(plain, attached)
    assert ok, why
    broken = attach_sync_probe("cpu", steps=8, extra_sync=True)
    ok, why = attach_sync_verdict(plain, broken)
    assert not ok and "5 explicit synchronisation(s) in 5 steady steps" in why, why


@pytest.mark.slow
def test_the_launched_sync_probe_passes_the_rank_and_names_a_synchronize_in_a_late_step():
    """`ddpviz doctor --gpu`'s launched_adds_no_sync check, on CPU (gloo, the rank's CPU twin, where the
    step clock's settle calls torch.cuda.synchronize as on CUDA): the metered, traced and last steps
    synchronise once each and the others never; a synchronize added to every late step, as it is issued or as it
    is read, is named."""
    from ddpviz.engine.harness.launched_sync import LAUNCHED_CFG, launched_sync_probe, launched_sync_verdict

    steps = LAUNCHED_CFG["steps"]
    got = launched_sync_probe("cpu")
    ok, why = launched_sync_verdict(got, steps)
    assert ok, why
    rows = [e for e in got["events"] if e["type"] == "step"]
    metered = {e["step"] for e in got["events"] if e["type"] == "gil"}
    instrumented = metered | {e["step"] for e in rows if e["memory_traced"]} | {steps - 1}
    assert sorted(s for s, _ in got["explicit_syncs"]) == sorted(instrumented)  # one each, none elsewhere
    late = steps - len(instrumented)
    for where in ("issue", "read"):  # a late step's read is charged to it, not to the step running then
        broken = launched_sync_probe("cpu", extra_sync=where)
        ok, why = launched_sync_verdict(broken, steps)
        assert not ok and f"{late} synchronisation(s) in steps read late" in why, (where, why)

