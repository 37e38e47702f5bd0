"""FSDP's events against independent references: the model's own parameter shapes, FSDP2's
documented dim-0 padding and root policy, ZeRO's 1/n memory claim, and the step's own clock.

One run: mlp 64 -> 32 -> 32 -> 10 on 3 ranks with AdamW, so every weight's rows pad (32 -> 33,
10 -> 12) and the optimizer holds two moments per parameter.
"""

import math

import pytest
import runs

from ddpviz.engine.config import RunConfig
from ddpviz.engine.data import load_dataset
from ddpviz.engine.models import build_model

pytestmark = pytest.mark.slow
N = 3
FIELDS = dict(mode="fsdp", model="mlp", width=32, depth=2, world_size=N, global_batch_size=30, steps=3,
              optimizer="adamw", lr=1e-3, eval_every=0, step_delay_s=0)
UNITS = {"hidden.0": "hidden.0.", "hidden.1": "hidden.1.", "root": "head."}


@pytest.fixture(scope="module")
def run():
    return runs.train(RunConfig(**FIELDS), "events")


@pytest.fixture(scope="module")
def shapes():
    """Unit -> parameter shapes, from the plain (unsharded) model."""
    cfg = RunConfig(**FIELDS)
    model = build_model(cfg, load_dataset(cfg))
    return {u: [tuple(p.shape) for n, p in model.named_parameters() if n.startswith(prefix)]
            for u, prefix in UNITS.items()}


def padded_bytes(shapes_of_unit):
    """All ranks' shards of a unit: each rank holds ceil(d0 / N) rows (FSDP2 pads dim 0)."""
    return sum(math.ceil(s[0] / N) * N * math.prod(s[1:]) for s in shapes_of_unit) * 4


def local_bytes(shapes_of_unit, rank):
    """One rank's unpadded rows: rank r holds rows [r*c, (r+1)*c) of d0, c = ceil(d0 / N)."""
    rows = lambda d0: max(0, min(math.ceil(d0 / N), d0 - rank * math.ceil(d0 / N)))  # noqa: E731
    return sum(rows(s[0]) * math.prod(s[1:]) for s in shapes_of_unit) * 4


def last_step(sink, type_, rank):
    evs = [e for e in sink.of_type(type_) if e["rank"] == rank]
    step = max(e["step"] for e in evs)
    return [e for e in evs if e["step"] == step]


@pytest.mark.parametrize("rank", range(N))
def test_each_unit_is_gathered_for_forward_and_backward_and_scattered_once(run, shapes, rank):
    _, sink = run
    got = {(e["unit"], e["kind"], e["phase"]): e for e in last_step(sink, "fsdp_collective", rank)}
    expected = {(u, "all_gather", "forward") for u in UNITS} | {(u, "reduce_scatter", "backward") for u in UNITS}
    expected |= {("hidden.0", "all_gather", "backward"), ("hidden.1", "all_gather", "backward")}  # not the root
    assert set(got) == expected
    for (unit, kind, _), e in got.items():
        assert e["nbytes"] == padded_bytes(shapes[unit]), (unit, kind)  # the real tensor FSDP2 handed over
        assert e["shard_nbytes"] * N == e["nbytes"]


@pytest.mark.parametrize("rank", range(N))
def test_collective_spans_lie_inside_the_pass_they_are_labelled_with(run, rank):
    _, sink = run
    step = last_step(sink, "step", rank)[0]
    spans = {s["phase"]: (s["start_s"], s["end_s"]) for s in step["phase_spans"]}
    slack = 2e-4  # one origin (the step's start mark, CollectiveLog.begin_step); 2e-3 with two readings failed
    for e in last_step(sink, "fsdp_collective", rank):
        lo, hi = spans[e["phase"]]
        assert lo - slack <= e["start_s"] < e["end_s"] <= hi + slack, e
    # on CPU every collective blocks the training thread: exposed comm is their union
    total = sum(e["end_s"] - e["start_s"] for e in last_step(sink, "fsdp_collective", rank))
    assert step["comm_exposed_s"] == pytest.approx(total, rel=1e-6)


def test_comm_volume_beside_the_formulas(run, shapes):
    _, sink = run
    P = sum(math.prod(s) for ss in shapes.values() for s in ss) * 4  # fp32 parameter bytes
    for vol in last_step(sink, "comm_volume", 0):
        assert vol["theory_sent_bytes"] == int(3 * (N - 1) / N * P)
        assert vol["theory_ddp_sent_bytes"] == int(2 * (N - 1) / N * P)
        gathered = 2 * padded_bytes(shapes["hidden.0"]) + 2 * padded_bytes(shapes["hidden.1"]) \
            + padded_bytes(shapes["root"])
        assert vol["all_gather_nbytes"] == gathered
        assert vol["reduce_scatter_nbytes"] == sum(padded_bytes(s) for s in shapes.values())


def curve_point(sink, rank, label):
    curve = last_step(sink, "fsdp_memory_curve", rank)[0]["points"]
    return next(p for p in curve if p["label"] == label)


@pytest.mark.parametrize("rank", range(N))
def test_parameters_gradients_and_optimizer_state_shrink_to_one_nth(run, shapes, rank):
    _, sink = run
    P = sum(math.prod(s) for ss in shapes.values() for s in ss) * 4
    shard = sum(padded_bytes(s) for s in shapes.values()) // N  # what one rank's shards hold
    end = curve_point(sink, rank, "optimizer end")
    assert end["sharded_params"] == shard and shard < 1.1 * P / N
    assert end["unsharded_params"] == 0 and end["sharded_grads"] == 0  # zero_grad(set_to_none)
    # AdamW: exp_avg and exp_avg_sq shaped like the unpadded local shard (so the last rank's are
    # smaller), plus a 4-byte `step` per parameter tensor
    moments = 2 * sum(local_bytes(s, rank) for s in shapes.values())
    assert end["optimizer_state"] == moments + 4 * 6 and moments < 2.2 * P / N
    grads = curve_point(sink, rank, "backward end")
    assert grads["sharded_grads"] == shard and grads["unsharded_grads"] == 0


@pytest.mark.parametrize("rank", range(N))
def test_the_gathered_unit_is_a_transient_peak_in_the_curve(run, shapes, rank):
    _, sink = run
    full_unit = sum(math.prod(s) for s in shapes["hidden.0"]) * 4
    before = curve_point(sink, rank, "step start")
    during = curve_point(sink, rank, "unsharded hidden.0")
    after = curve_point(sink, rank, "all_gather start hidden.1")  # hidden.0 resharded by now
    assert before["unsharded_params"] == 0
    assert during["unsharded_params"] >= full_unit
    assert during["tensor_bytes"] - before["tensor_bytes"] >= full_unit
    assert after["unsharded_params"] < full_unit
    # The ledger sees every storage at every moment of the step; the hook-time points are
    # samples of some of them, so none can be above its peak, and the gathered unit is in it.
    mem = last_step(sink, "memory", rank)[0]
    curve = last_step(sink, "fsdp_memory_curve", rank)[0]["points"]
    assert mem["source"] == "tensors"
    assert mem["peak_allocated_bytes"] >= max(p["tensor_bytes"] for p in curve)
    assert mem["peak_allocated_bytes"] - mem["curve"]["tensors"][0][1] >= full_unit
