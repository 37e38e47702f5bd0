"""The predictor's step models against answers worked out by hand (no run, no torch)."""

import math

import pytest

from ddpviz.engine.predict.inputs import RunInputs
from ddpviz.engine.predict.presets import LINKS, custom_link
from ddpviz.engine.predict.scaleout import Scenario, cpu_threads, predict, predict_ddp, predict_dp, time_share
from ddpviz.engine.predict.step_models import (
    bucket_pipeline,
    exposed_s,
    hub_copies_s,
    pipelined_copies_s,
    ring_allreduce_s,
    tree_allreduce_s,
)

MS = 1e-3


def flat(spans):
    return [t for span in spans for t in span]


def test_ring_allreduce_time_by_hand():
    # n = 4: 2(n-1) = 6 latencies of 10 us, and 2(n-1)/n = 1.5 x 1 MB at 1 GB/s = 1.5 ms
    assert ring_allreduce_s(1e6, 4, 10e-6, 1e9) == pytest.approx(60e-6 + 1.5e-3)
    assert ring_allreduce_s(1e6, 1, 10e-6, 1e9) == 0.0
    with pytest.raises(ValueError, match="beta_bytes_per_s"):
        ring_allreduce_s(1e6, 2, 0.0, 0.0)


def test_tree_allreduce_time_by_hand():
    # n = 8: ⌈log2 8⌉ = 3 levels up and 3 down -> 6 α; bandwidth 2·7/8 · 1 MB / 1 GB/s = 1.75 ms
    assert tree_allreduce_s(1e6, 8, 10e-6, 1e9) == pytest.approx(60e-6 + 1.75e-3)
    assert ring_allreduce_s(1e6, 8, 10e-6, 1e9) == pytest.approx(140e-6 + 1.75e-3)
    # n = 5 is not a power of two: ⌈log2 5⌉ = 3; latency alone (0 bytes) at 64 ranks: 12 α vs 126 α
    assert tree_allreduce_s(0.0, 5, 1.0, 1.0) == 6.0
    assert tree_allreduce_s(0.0, 64, 1.0, 1.0) == 12.0 and ring_allreduce_s(0.0, 64, 1.0, 1.0) == 126.0
    assert tree_allreduce_s(1e9, 1, 1.0, 1.0) == 0.0
    with pytest.raises(ValueError, match="beta_bytes_per_s"):
        tree_allreduce_s(1.0, 2, 0.0, 0.0)


def test_ddp_with_the_tree_model_pays_log_n_latency():
    """Latency only (β huge): one bucket of each at 16 ranks, α = 10 µs: ring 2·15·10 = 300 µs per
    bucket, tree 2·4·10 = 80 µs; the last bucket ends backward + its all-reduce."""
    sc = dict(link=custom_link(10e-6, 1e18))
    ring = predict_ddp(_ddp_inputs(), 16, Scenario(**sc))
    tree = predict_ddp(_ddp_inputs(), 16, Scenario(**sc, allreduce_algo="tree"))
    assert ring["comm_exposed_s"] == pytest.approx(300e-6, rel=1e-6)
    assert tree["comm_exposed_s"] == pytest.approx(80e-6, rel=1e-6)
    with pytest.raises(ValueError, match="allreduce_algo"):
        from ddpviz.engine.predict.scaleout import check_scenario

        check_scenario(Scenario(allreduce_algo="star"))


def test_bucket_pipeline_waits_for_the_previous_all_reduce():
    # ready at 1, 2, 5 ms; all-reduces of 3, 1, 1 ms on one stream:
    # b0 1->4, b1 waits for b0: 4->5, b2 ready at 5: 5->6; backward ends at 5, so 1 ms exposed
    spans = bucket_pipeline([1 * MS, 2 * MS, 5 * MS], [3 * MS, 1 * MS, 1 * MS])
    assert flat(spans) == pytest.approx([1 * MS, 4 * MS, 4 * MS, 5 * MS, 5 * MS, 6 * MS])
    assert exposed_s(5 * MS, spans) == pytest.approx(1 * MS)
    # overlap off: everything starts after the last bucket is ready: 5->8, 8->9, 9->10
    off = bucket_pipeline([1 * MS, 2 * MS, 5 * MS], [3 * MS, 1 * MS, 1 * MS], overlap=False)
    assert flat(off) == pytest.approx([5 * MS, 8 * MS, 8 * MS, 9 * MS, 9 * MS, 10 * MS])
    assert exposed_s(5 * MS, off) == pytest.approx(5 * MS)


def test_hub_and_pipelined_copies_by_hand():
    # 4 devices, 1 MB, 1 GB/s, 10 us, 20 us host overhead: 3 x (20 + 10 + 1000) us
    assert hub_copies_s(4, 1e6, 10e-6, 1e9, 20e-6) == pytest.approx(3 * 1030e-6)
    # NCCL chain: 3 x (20 + 10) us + 1 ms once
    assert pipelined_copies_s(4, 1e6, 10e-6, 1e9, 20e-6) == pytest.approx(90e-6 + 1e-3)
    assert hub_copies_s(1, 1e6, 10e-6, 1e9) == 0.0 and pipelined_copies_s(1, 1e6, 10e-6, 1e9) == 0.0


def test_cpu_threads_and_time_share_follow_the_engine_rule():
    # engine.components.training.cpu_threads_per_rank: max(1, cores // n); 2 cores
    assert [cpu_threads(n, 2) for n in (1, 2, 3, 4)] == [2, 1, 1, 1]
    assert [time_share(n, 2) for n in (1, 2, 3, 4)] == [1.0, 1.0, 1.5, 2.0]
    assert time_share(3, 8) == 1.0  # 3 x 2 threads on 8 cores


def _ddp_inputs(**kw) -> RunInputs:
    base = dict(run_id="r", mode="ddp", world_size=2, global_batch_size=64, grad_bytes=4_000_000,
                param_count=1_000_000, device_kind="cuda", backend="nccl", emulated=False,
                host_cpu_count=None, cpu_threads_per_device=None, amp=False, overlap=True,
                optimizer="sgd", tokens_per_sample=1, steps_used=10, step_time_s=0.0, samples_per_s=0.0,
                forward_s=2 * MS, backward_s=4 * MS, comm_exposed_s=0.0, optimizer_s=1 * MS,
                other_s=0.5 * MS,
                buckets=[dict(bucket_index=0, nbytes=1_000_000, ready_frac=0.25, comm_s=0.0),
                         dict(bucket_index=1, nbytes=3_000_000, ready_frac=1.0, comm_s=0.0)])
    return RunInputs(**{**base, **kw})


def test_ddp_step_at_4_ranks_by_hand():
    """Measured at n=2 with 32 samples per rank; at n=4 each rank computes 16 (all compute
    proportional to the batch): forward 1 ms, backward 2 ms; buckets ready at 0.5 and 2 ms.
    Link 1 GB/s, 0 latency: all-reduce = 1.5 x bytes / 1e9 -> 1.5 ms and 4.5 ms.
    b0 0.5 -> 2.0, b1 2.0 -> 6.5; exposed 6.5 - 2 = 4.5 ms; step 1 + 2 + 4.5 + 1 + 0.5 = 9 ms."""
    sc = Scenario(link=custom_link(0.0, 1e9))
    p = predict_ddp(_ddp_inputs(), 4, sc)
    assert flat((b["comm_start_s"], b["comm_end_s"]) for b in p["buckets"]) == \
        pytest.approx([0.5 * MS, 2.0 * MS, 2.0 * MS, 6.5 * MS])
    assert p["comm_exposed_s"] == pytest.approx(4.5 * MS)
    assert p["step_time_s"] == pytest.approx(9 * MS)
    assert p["samples_per_s"] == pytest.approx(64 / 9e-3)
    assert p["bytes_per_rank"] == pytest.approx(1.5 * 4_000_000)
    # half of compute fixed: forward 2 x (0.5 + 0.5 x 0.5) = 1.5 ms, backward 3 ms; b1 ready at 3
    # b0 0.75 -> 2.25, b1 3 -> 7.5; exposed 4.5; step 1.5 + 3 + 4.5 + 1 + 0.5 = 10.5 ms
    half = predict_ddp(_ddp_inputs(), 4, Scenario(link=custom_link(0.0, 1e9), fixed_fraction=0.5))
    assert half["step_time_s"] == pytest.approx(10.5 * MS)


def test_ddp_across_hosts_takes_the_slowest_link():
    r = _ddp_inputs()
    sc = Scenario(link=LINKS["nvlink-h100"], inter_link=LINKS["eth25"], devices_per_host=8)
    inside, across = predict_ddp(r, 8, sc), predict_ddp(r, 16, sc)
    assert inside["nnodes"] == 1 and across["nnodes"] == 2
    assert inside["link"]["beta_bytes_per_s"] == LINKS["nvlink-h100"].beta_bytes_per_s
    assert across["link"]["beta_bytes_per_s"] == LINKS["eth25"].beta_bytes_per_s
    assert across["link"]["alpha_s"] == LINKS["eth25"].alpha_s
    with pytest.raises(ValueError, match="inter_link"):
        predict_ddp(r, 16, Scenario(link=LINKS["nvlink-h100"], devices_per_host=8))


def test_ddp_on_a_gpu_preset_uses_six_n_flops():
    from ddpviz.engine.predict.presets import COMPUTES

    gpu = COMPUTES["h100"]
    p = predict_ddp(_ddp_inputs(), 2, Scenario(link=custom_link(0.0, 1e12), compute=gpu, utilisation=0.5))
    flops = 6 * 1_000_000 * 32  # 6 N per sample, 32 samples per rank
    assert p["forward_s"] + p["backward_s"] == pytest.approx(flops / (gpu.fp32_flops * 0.5))
    assert p["backward_s"] == pytest.approx(2 * p["forward_s"])
    assert p["optimizer_s"] == pytest.approx(3 * 4_000_000 / (gpu.hbm_bytes_per_s * 0.5))


def _dp_inputs() -> RunInputs:
    """DP measured at n=2: broadcast hub span 0.3 ms for 1 MB copied at 0.25 ms (4 GB/s, the
    fastest copy: this machine's copy rate), so 0.05 ms host overhead per device; reduce 0.5 ms
    for 1 MB copied (and added) in 0.5 ms: 0.5 - 1e6/4e9 = 0.25 ms overhead;
    scatter/gather chunks of 8 KB, forward/backward spans with 0.1 ms thread dispatch."""
    phases = dict(
        broadcast=dict(hub_s=0.3 * MS, bytes_per_copy=1e6, copy_s=0.25 * MS, wall_s=0.3 * MS, device_s=0.3 * MS),
        reduce=dict(hub_s=0.5 * MS, bytes_per_copy=1e6, copy_s=0.5 * MS, wall_s=0.5 * MS, device_s=0.5 * MS),
        scatter=dict(hub_s=0.01 * MS, bytes_per_copy=8e3, copy_s=0.002 * MS, wall_s=0.01 * MS, device_s=0.01 * MS),
        gather=dict(hub_s=0.01 * MS, bytes_per_copy=8e3, copy_s=0.002 * MS, wall_s=0.01 * MS, device_s=0.01 * MS),
        forward=dict(wall_s=1.1 * MS, device_s=1.0 * MS), backward=dict(wall_s=2.1 * MS, device_s=2.0 * MS),
        loss=dict(hub_s=0.2 * MS), optimizer=dict(hub_s=0.4 * MS), other=dict(wall_s=0.3 * MS))
    return _ddp_inputs(mode="dp", device_kind="cpu", backend=None, emulated=True, host_cpu_count=64,
                       cpu_threads_per_device=32, optimizer_s=0.4 * MS, buckets=[], dp_phases=phases)


def test_dp_hub_time_on_4_devices_by_hand():
    """Link 1 GB/s, 10 us: broadcast 3 x (0.05 + 0.01 + 1) ms = 3.18 ms; reduce
    3 x (0.25 + 0.01 + 1) = 3.78 ms; scatter/gather chunks 8 KB x 2/4 = 4 KB, overhead
    0.01 - 8e3/4e9 = 0.008 ms: 3 x (0.008 + 0.01 + 0.004) = 0.066 ms each; forward: compute
    proportional to the batch, 1 ms x 16/32 + 0.1 ms x 3 threads = 0.8 ms, backward 1.3 ms;
    loss 0.2, optimizer 0.4, other 0.3. Step = 3.18 + 3.78 + 0.132 + 0.8 + 1.3 + 0.9 = 10.092 ms."""
    p = predict_dp(_dp_inputs(), 4, Scenario(link=custom_link(10e-6, 1e9)))
    ph = p["phases"]
    assert ph["broadcast"] == pytest.approx(3.18 * MS)
    assert ph["reduce"] == pytest.approx(3.78 * MS)
    assert ph["scatter"] == pytest.approx(0.066 * MS)
    assert ph["forward"] == pytest.approx(0.8 * MS) and ph["backward"] == pytest.approx(1.3 * MS)
    assert p["step_time_s"] == pytest.approx(10.092 * MS)
    # device 0 moves (n-1) x (1 MB + 1 MB + 4 KB + 4 KB) per step
    assert p["device0_bytes"] == pytest.approx(3 * (2e6 + 8e3))


def test_dp_on_this_machine_at_4_devices_by_hand():
    """Out of sample (measured at n = 2, predicted at n = 4) on this machine's link: α = 0, β =
    the fastest copy, 1 MB in 0.25 ms = 4 GB/s. Broadcast: overhead 0.3 - 0.25 = 0.05 ms, so
    3 x (0.05 + 0.25) = 0.9 ms; reduce: overhead 0.5 - 0.25 = 0.25 ms, so 3 x (0.25 + 0.25) = 1.5 ms."""
    p = predict_dp(_dp_inputs(), 4, Scenario())
    assert p["phases"]["broadcast"] == pytest.approx(0.9 * MS)
    assert p["phases"]["reduce"] == pytest.approx(1.5 * MS)


def test_dp_with_nccl_collectives_sends_the_parameters_once():
    sc = Scenario(link=custom_link(10e-6, 1e9), dp_collectives="nccl")
    p = predict_dp(_dp_inputs(), 4, sc)
    assert p["phases"]["broadcast"] == pytest.approx(3 * (0.05 + 0.01) * MS + 1 * MS)
    assert p["device0_bytes"] == pytest.approx(2e6 + 3 * 8e3)


def test_dp_beyond_one_host_is_not_predicted():
    sc = Scenario(link=LINKS["pcie4"], inter_link=LINKS["eth100"], devices_per_host=8)
    assert predict_dp(_dp_inputs(), 16, sc) is None
    assert math.isfinite(predict_dp(_dp_inputs(), 8, sc)["step_time_s"])


def test_dp_and_ddp_start_from_one_devices_step():
    """At n = 1 DataParallel runs its module directly (torch.nn.parallel.DataParallel.forward), so DP's
    step is one device's, as DDP's (no peer to all-reduce with): by hand, DDP measured at n = 2 with 32 samples
    per rank, at n = 1 a device computes 64: forward 4 ms, backward 8 ms, optimizer 1, other 0.5 = 13.5 ms for
    both modes, each at 100% efficiency; at n = 2 DP is its own model again (copies through device 0)."""
    sc = Scenario(link=custom_link(10e-6, 1e9))
    rows = predict({"dp": _dp_inputs(), "ddp": _ddp_inputs()}, [1, 2], sc)
    at = {(r["mode"], r["world_size"]): r for r in rows}
    assert at["ddp", 1]["step_time_s"] == pytest.approx(13.5 * MS)
    assert at["dp", 1]["step_time_s"] == pytest.approx(13.5 * MS)
    phases = {k: v for k, v in at["dp", 1]["phases"].items() if v}  # the one device's parts, by hand
    assert phases == pytest.approx({"forward": 4 * MS, "backward": 8 * MS, "optimizer": 1 * MS, "other": 0.5 * MS})
    assert at["dp", 1]["efficiency"] == pytest.approx(1.0) and at["ddp", 1]["efficiency"] == pytest.approx(1.0)
    assert at["dp", 2]["step_time_s"] == pytest.approx(predict_dp(_dp_inputs(), 2, sc)["step_time_s"])
