"""engine.tune, on hand-worked inputs: bucket layouts against PyTorch's own assignment, the
candidates of a hand-made layout, the prediction of a hand-worked step, the interval rule, the loss
check, the budget plan, the paste lines (issue 35)."""

from __future__ import annotations

import json
import random

import pytest
import torch
import torch.distributed as dist

from ddpviz.engine.tune import (MIB, TuneError, candidates, compare, layout_bytes, loss_diff, measure_trial,
                                paste_lines, parse_knobs, pick_best, plan, predict_ratio, prediction_error,
                                ready_order, same_math, answer_line)


@pytest.mark.parametrize("cap", [1, 5000, 40_000, 100_000, 10**9])
def test_layout_is_pytorchs_bucket_assignment(cap):
    """The bytes of each bucket equal those of torch.distributed's own assignment
    (`_compute_bucket_assignment_by_size`, which DDP's reducer uses) for the same tensors and cap."""
    rng = random.Random(cap)
    tensors = [torch.empty(rng.randint(1, 6000), dtype=torch.float32) for _ in range(25)]
    groups, _ = dist._compute_bucket_assignment_by_size(tensors, [cap])
    groups = sorted(groups, key=min)  # pytorch returns them by their first tensor
    theirs = [sum(tensors[i].numel() * 4 for i in g) for g in groups]
    assert layout_bytes([t.numel() * 4 for t in tensors], cap) == theirs


def test_layout_closes_a_bucket_that_reaches_its_cap_exactly():
    tensors = [torch.empty(1000) for _ in range(5)]  # 4000 bytes each, cap 8000: [8000, 8000, 4000]
    groups, _ = dist._compute_bucket_assignment_by_size(tensors, [8000])
    assert [len(g) * 4000 for g in sorted(groups, key=min)] == [8000, 8000, 4000]
    assert layout_bytes([4000] * 5, 8000) == [8000, 8000, 4000]


def test_layout_first_bucket_cap_is_pytorchs():
    tensors = [torch.empty(n) for n in (300, 200, 700, 100, 900, 50)]
    groups, _ = dist._compute_bucket_assignment_by_size(tensors, [1000, 3000])
    theirs = [sum(tensors[i].numel() * 4 for i in g) for g in sorted(groups, key=min)]
    assert layout_bytes([t.numel() * 4 for t in tensors], 3000, first_cap_bytes=1000) == theirs


def _ddp_record(param_nbytes, cap_bytes=25 * MIB, first=MIB, has_buffers=False, backend=None, **settings):
    s = dict(bucket_cap_mb=cap_bytes / MIB, first_bucket_bytes=first, gradient_as_bucket_view=False,
             static_graph=False, broadcast_buffers=True, find_unused_parameters=False)
    s.update(settings)
    return dict(param_nbytes=list(param_nbytes), bucket_bytes_cap=cap_bytes, has_buffers=has_buffers, settings=s,
                backend=backend)


def test_candidates_of_a_hand_made_layout():
    """Eight 4 MiB parameters (32 MiB), the script on DDP's defaults (25 MiB, first bucket 1 MiB):
    its layout is [4, 28] MiB. One bucket: cap 32 -> [32]; half: 12.5 -> 13 MiB -> [16, 16];
    double: 50 -> [32], the same as one bucket, left out; ~4 buckets: 8 -> [8, 8, 8, 8];
    ~8 buckets: 4 -> [4] x 8."""
    cands, skipped = candidates(_ddp_record([4 * MIB] * 8), parse_knobs(None))
    caps = [(c["knobs"], [b // MIB for b in c["layout_bytes"]]) for c in cands if "bucket_cap_mb" in c["knobs"]]
    assert caps == [({"bucket_cap_mb": 32.0}, [32]), ({"bucket_cap_mb": 13.0}, [16, 16]),
                    ({"bucket_cap_mb": 8.0}, [8, 8, 8, 8]), ({"bucket_cap_mb": 4.0}, [4] * 8)]
    assert [c["knobs"] for c in cands if "bucket_cap_mb" not in c["knobs"]] == [
        {"gradient_as_bucket_view": True}, {"static_graph": True}]
    assert skipped == ["broadcast_buffers: the model has no buffers, so DDP broadcasts none already"]


def test_candidates_follow_the_scripts_settings_and_the_knobs_asked_for():
    rec = _ddp_record([1000] * 4, cap_bytes=4000, first=4000, has_buffers=True, static_graph=True)
    cands, skipped = candidates(rec, ["static_graph", "broadcast_buffers", "fp16"])
    assert [c["knobs"] for c in cands] == [{"broadcast_buffers": False}, {"comm_hook": "fp16"}]
    assert skipped == ["static_graph: the script already sets it"]
    _, skipped = candidates(_ddp_record([1000] * 4), ["static_graph"], no_sync=True)
    assert skipped == ["static_graph: the script accumulates under no_sync(), which static_graph=True does not "
                       "support (pytorch/pytorch#143580)"]
    # PowerSGD on gloo hangs with two buckets or more (engine.modes.ddp.comm_hooks): not tried there
    two = _ddp_record([4 * MIB] * 8, backend="gloo")  # [4, 28] MiB at DDP's defaults
    cands, skipped = candidates(two, ["powersgd", "fp16"])
    assert [c["knobs"] for c in cands] == [{"comm_hook": "fp16"}]
    assert skipped[0].startswith("powersgd: the script's gradients are in 2 buckets on gloo")
    one = _ddp_record([1000] * 4, backend="gloo")
    assert [c["knobs"] for c in candidates(one, ["powersgd"])[0]] == [{"comm_hook": "powersgd"}]
    assert [c["knobs"] for c in candidates({**two, "backend": "nccl"}, ["powersgd"])[0]] == [{"comm_hook": "powersgd"}]
    with pytest.raises(TuneError, match="--knobs: nope not known"):
        parse_knobs("bucket_cap_mb,nope")


def _bucket(rank, step, index, nbytes, ready, start, end):
    return dict(type="bucket", rank=rank, step=step, bucket_index=index, nbytes=nbytes, ready_s=ready,
                comm_start_s=start, comm_end_s=end, ddp_index=0)


def test_prediction_of_a_hand_worked_step():
    """Two 1000-byte buckets ready at 1 and 2 ms of a 2 ms backward, each all-reduce 1 ms (2 ranks:
    t = b / beta, beta = 1e6 B/s, alpha 0 from one size): the model's exposed comm is 3 - 2 = 1 ms.
    One 2000-byte bucket: ready at 2 ms, 2 ms of all-reduce, 2 ms exposed. The measured step is
    10 ms, so the prediction is (10 + 2 - 1) / 10 = 1.1."""
    buckets = [_bucket(r, s, 0, 1000, 0.001, 0.001, 0.002) for r in (0, 1) for s in (2, 3)] + \
              [_bucket(r, s, 1, 1000, 0.002, 0.002, 0.003) for r in (0, 1) for s in (2, 3)]
    base = dict(buckets=buckets, world_size=2, backward_s=0.002, step_time_s=0.010)
    ratio, basis = predict_ratio(base, dict(knobs={"bucket_cap_mb": 1.0}, layout_bytes=[2000]))
    assert ratio == pytest.approx(1.1)
    assert "step model" in basis
    assert predict_ratio(base, dict(knobs={"static_graph": True})) == (
        1.0, "the step model has no term for static_graph: predicted unchanged")
    half, _ = predict_ratio(base, dict(knobs={"comm_hook": "fp16"}))  # [500, 500]: 0.5 ms each, ends 2.5 ms
    assert half == pytest.approx((0.010 + 0.0005 - 0.001) / 0.010)


def test_interval_rule_on_constructed_rounds():
    win = compare([(1.0, 0.80), (1.02, 0.81), (0.99, 0.79), (1.01, 0.82)])
    assert win["verdict"] == "faster" and win["interval"][1] < 1
    level = compare([(1.0, 0.9), (1.0, 1.1), (1.0, 1.0), (1.0, 1.05)])
    assert level["verdict"] == "level" and level["interval"][0] < 1 < level["interval"][1]
    assert compare([(1.0, 1.3), (1.0, 1.2), (1.0, 1.25)])["verdict"] == "slower"
    two = compare([(1.0, 0.8), (1.0, 0.81)])  # both faster, but 2 rounds: a null does that 1 time in 4
    assert two["verdict"] == "too few rounds" and two["ratio"] == pytest.approx(0.805)
    with pytest.raises(TuneError, match="step times must be > 0"):
        compare([(0.0, 1.0)])


def test_best_needs_an_interval_below_one_and_the_same_math():
    trials = [dict(knobs={"bucket_cap_mb": 4.0}, ratio=0.8, interval=[0.7, 0.9], verdict="faster", rejected=True),
              dict(knobs={"static_graph": True}, ratio=0.9, interval=[0.85, 0.95], verdict="faster", rejected=False),
              dict(knobs={"gradient_as_bucket_view": True}, ratio=0.7, interval=[0.5, 1.1], verdict="level",
                   rejected=False)]
    best = pick_best(trials)
    assert best["knobs"] == {"static_graph": True} and best["gain"] == pytest.approx(0.1)
    assert best["paste"] == ["DistributedDataParallel(model, ..., static_graph=True)"]
    assert answer_line(best).startswith("best: static_graph=True: step time x0.900")
    assert pick_best(trials[2:]) is None
    assert answer_line(None).startswith("none beat the baseline beyond noise")


def test_paste_lines():
    assert paste_lines({"bucket_cap_mb": 4.0}) == ["DistributedDataParallel(model, ..., bucket_cap_mb=4.0)"]
    assert paste_lines({"broadcast_buffers": False}) == ["DistributedDataParallel(model, ..., broadcast_buffers=False)"]
    hook = paste_lines({"comm_hook": "fp16"})
    assert hook[0].startswith("from torch.distributed.algorithms.ddp_comm_hooks import default_hooks")
    assert hook[1] == "ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)"


def test_loss_check():
    base = {0: [2.0, 1.5, 1.0], 1: [2.1, 1.6, 1.1]}
    assert loss_diff(base, {0: [2.0, 1.5, 1.0], 1: [2.1, 1.6, 1.1005]}) == pytest.approx(0.0005)
    assert same_math("same", 5e-4, 1e-5, 0.0)[0] is True
    assert same_math("same", 0.0, 1e-5, 0.0) == (False, "same math: losses within 1e-05 of the baseline's "
                                                       "(largest difference 0)")
    rejected, note = same_math("hook", 5e-4, 1e-5, 0.0)
    assert not rejected and note.startswith("changes the numbers")
    rejected, note = same_math("same", 5e-4, 1e-5, 1e-3)  # the baseline's own runs differ more
    assert not rejected and "not deterministic" in note


def test_measure_trial_takes_the_slowest_rank_of_each_steady_step():
    ev = [dict(type="step", rank=r, step=s, step_time_s=t, loss=10.0 - s, backward_s=0.001, no_sync_micro_steps=1)
          for s, (t0, t1) in enumerate([(9, 9), (9, 9), (0.010, 0.012), (0.020, 0.011), (0.013, 0.014)])
          for r, t in ((0, t0), (1, t1))]
    ev.append(dict(type="log", rank=0, tune="ddp", settings={}, param_nbytes=[4]))
    m = measure_trial(ev, warmup=2)
    assert m["steps"] == 5 and m["world_size"] == 2 and m["no_sync_micro_steps"] == 10
    assert m["steady_steps"] == [0.012, 0.020, 0.014] and m["step_time_s"] == 0.014
    assert m["losses"] == {0: [10.0, 9.0, 8.0, 7.0, 6.0], 1: [10.0, 9.0, 8.0, 7.0, 6.0]}


def test_plan_fits_the_budget():
    assert plan(100, 10, 6, 3) == (3, 2)  # 10 trials: 3 rounds of the baseline and 2 candidates
    assert plan(1000, 10, 6, 3) == (3, 6)
    assert plan(15, 10, 3, 3) == (0, 1)


def test_prediction_error_and_json_shape():
    trials = [dict(predicted_ratio=1.1, ratio=1.0), dict(predicted_ratio=0.9, ratio=1.2),
              dict(predicted_ratio=None, ratio=1.0)]
    err = prediction_error(trials)
    assert err["count"] == 2 and err["median_abs"] == pytest.approx((0.1 + 0.25) / 2)
    assert err["worst"] == pytest.approx(-0.25)
    json.dumps(err)
    assert ready_order([1, 2, 3]) == [3, 2, 1]
