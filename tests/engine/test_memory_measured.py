"""Memory is measured from the run's own tensors: DP's device-0 hot spot, DDP's equal ranks.

The acceptance case of "Measured, not assumed": logits 64 -> 20,000, global batch 64, 2 devices.
Nothing in the engine knows this model; the figures come from the live-tensor ledger. References:
the model's own parameter bytes P (computed here from its shapes) and what must coexist by how
DP and DDP work (DDP keeps gradients and, without gradient_as_bucket_view, a bucket copy of them:
torch/nn/parallel/distributed.py docs).
"""

import pytest

from ddpviz.engine.config import validate_config
from ddpviz.engine.events import ListSink
from ddpviz.engine.run import run_training

P_WIDE = (64 * 64 + 64 + 64 * 20_000 + 20_000) * 4  # parameter (and gradient) bytes
LOGITS_BYTES = 64 * 20_000 * 4  # the global batch's logits


def run(**fields):
    sink = ListSink()
    cfg = validate_config(dict(dict(global_batch_size=64, steps=3, eval_every=0, step_delay_s=0, lr=0.01, optimizer="sgd"),
                               **fields))
    result = run_training(cfg, sink, "m")
    assert result.status == "succeeded", result.error
    return result, sink


def peaks(sink):
    out = {}
    for e in sink.of_type("memory"):
        key = (e["rank"], e["device"])
        out[key] = max(out.get(key, 0), e["peak_allocated_bytes"])
    return out


@pytest.mark.slow
def test_wide_logits_dp_device0_is_the_hot_spot_and_ddp_ranks_are_equal(models):
    dp_result, dp = run(model="widelogits", mode="dp")
    ddp_result, ddp = run(model="widelogits", mode="ddp")
    dp_peak, ddp_peak = peaks(dp), peaks(ddp)
    d0, d1 = dp_peak[(0, "cpu:0")], dp_peak[(0, "cpu:1")]
    assert d0 > 1.3 * d1, (d0, d1)
    assert max(ddp_peak.values()) / min(ddp_peak.values()) < 1.05, ddp_peak
    # what must coexist: a replica's weights and its gradient; on device 0 also the gathered logits
    assert d1 >= 2 * P_WIDE
    assert d0 >= 2 * P_WIDE + LOGITS_BYTES
    # DDP (gradient_as_bucket_view=False): parameters, gradients and the bucket copy of them
    assert min(ddp_peak.values()) >= 3 * P_WIDE
    for e in ddp.of_type("memory"):
        assert e["breakdown"]["bucket_buffers"] >= P_WIDE and e["breakdown"]["params"] == P_WIDE
    for e in dp.of_type("memory") + ddp.of_type("memory"):
        assert e["source"] == "tensors" and e["sampler"]["readings"] >= 2  # the step's start and end
        assert e["curve"]["tensors"] and e["process_rss_bytes"] > 0
    assert dp_result.summary["peak_memory_bytes"] == {"cpu:0": d0, "cpu:1": d1}
    assert dp_result.summary["memory_imbalance"] == pytest.approx(d0 / d1)


@pytest.mark.slow
def test_bucket_view_saves_ddp_a_copy_of_the_gradients():
    # PyTorch's DDP docs: gradient_as_bucket_view=True "can reduce peak memory usage, where the
    # saved memory size will be equal to the total gradients size" — less what backward holds for a
    # moment either way (a layer's incoming gradient, activation gradients: here about a quarter
    # of P, in 8 layers of ~14% of P each). Steps 0 and 1 are left out: there the views are first
    # made and the buckets rebuilt, with both copies alive.
    # with the comm hook, which is handed the bucket buffers and shows them to the ledger on sight;
    # with no hook (bucket_timing=recorder) their bytes come from DDP's layout (`LayoutBuckets.held_nbytes`)
    deep = dict(model="mlp", width=256, depth=8, mode="ddp", steps=4, bucket_timing="hook")
    P = (64 * 256 + 256 + 7 * (256 * 256 + 256) + 256 * 10 + 10) * 4

    def last_peak(**fields):
        return max(e["peak_allocated_bytes"] for e in run(**fields)[1].of_type("memory") if e["step"] == 3)
    copy, view = last_peak(**deep), last_peak(**deep, gradient_as_bucket_view=True)
    assert 0.6 * P <= copy - view <= 1.01 * P, (copy - view, P)


def test_dp_within_step_curve_shows_the_gather_and_the_reduce_on_device0(models):
    _, dp = run(model="widelogits", mode="dp", steps=1)
    mem = {e["device"]: e for e in dp.of_type("memory")}
    bd0, bd1 = mem["cpu:0"]["breakdown"], mem["cpu:1"]["breakdown"]
    assert bd0.get("gathered_outputs", 0) >= LOGITS_BYTES  # the gathered logits, on device 0 only
    assert "gathered_outputs" not in bd1 and "optimizer_state" not in bd1
    curve = mem["cpu:0"]["curve"]["tensors"]
    start, peak = curve[0][1], max(b for _, b in curve)
    assert peak == mem["cpu:0"]["peak_allocated_bytes"] > start  # rises within the step
    assert all(0 <= t <= mem["cpu:0"]["step_span_s"] + 1e-6 for t, _ in curve)


def test_with_no_comm_hook_the_bucket_buffers_are_the_ones_the_hook_is_handed():
    """bucket_timing=recorder: no hook sees DDP's bucket buffers, so their bytes come from DDP's
    layout (`LayoutBuckets.held_nbytes`). Reference: the same run with the hook, whose buffers the
    ledger counts on sight, and the model's gradient bytes (buckets hold every gradient once),
    on every traced step of both ranks, the first (DDP's initial buckets) included."""
    fields = dict(model="mlp", width=64, depth=6, mode="ddp", steps=4, bucket_cap_mb=0.01)
    P = (64 * 64 + 64 + 5 * (64 * 64 + 64) + 64 * 10 + 10) * 4

    def held(**more):
        return {(e["rank"], e["step"]): e["breakdown"].get("bucket_buffers")
                for e in run(**fields, **more)[1].of_type("memory") if "breakdown" in e}
    hook, recorder = held(bucket_timing="hook"), held(bucket_timing="recorder")
    assert set(recorder) == set(hook) and {s for _, s in recorder} >= {0, 3}
    assert all(v == P for v in hook.values()), hook
    assert recorder == hook
    assert set(held(bucket_timing="recorder", gradient_as_bucket_view=True).values()) == {None}  # the grads' own storage
