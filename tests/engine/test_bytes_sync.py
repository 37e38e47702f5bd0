"""Bytes moved and replica checks, measured on the run's tensors and able to fail.

References: parameter and activation bytes worked out by hand from the model's shapes; DDP's
documented buffer broadcast (`broadcast_buffers=True`: rank 0's buffers before every forward);
DataParallel's documented replica semantics (torch/nn/parallel/data_parallel.py: a counter
incremented in forward "will always stay at the initial value because the update is done on the
replicas which are destroyed after forward", while "in-place updates to the parameters or
buffers on device[0] will be recorded").
"""

import pytest
import runs
import torch

from ddpviz.engine.components.devices import resolve_plan
from ddpviz.engine.config import RunConfig
from ddpviz.engine.data import load_dataset
from ddpviz.engine.events import ListSink
from ddpviz.engine.measure.telemetry import Telemetry

SMALL = dict(model="mlp", width=32, depth=2, global_batch_size=32, steps=3, eval_every=0, step_delay_s=0)
P_SMALL = (64 * 32 + 32 + 32 * 32 + 32 + 32 * 10 + 10) * 4  # 13,864 B of parameters (= gradients)


def run(**fields):
    return runs.train(fields, "b")


def test_dp_counts_every_copy_device_0_makes_by_its_tensors():
    _, sink = run(mode="dp", **SMALL)
    x_chunk, out_chunk = 16 * 64 * 4, 16 * 10 * 4  # half the batch of digits in, its logits out
    vol = {e["device"]: e for e in sink.of_type("comm_volume") if e["step"] == 2}
    assert vol["cpu:1"]["recv_bytes"] == P_SMALL + x_chunk + out_chunk  # weights, inputs, d(out)
    assert vol["cpu:1"]["sent_bytes"] == out_chunk + P_SMALL  # outputs, gradients
    assert vol["cpu:0"]["sent_bytes"] == vol["cpu:1"]["recv_bytes"]
    assert {e["volume_source"] for e in vol.values()} == {"measured"}
    phases = {(e["phase"], e["device"]): e["nbytes"] for e in sink.of_type("dp_phase") if e["step"] == 2}
    assert phases[("broadcast", "cpu:1")] == phases[("reduce", "cpu:1")] == P_SMALL


@pytest.mark.slow
def test_ddp_reports_the_bucket_bytes_it_all_reduced_and_derives_the_wire_bytes():
    _, sink = run(mode="ddp", bucket_cap_mb=0.005, **SMALL)
    for e in sink.of_type("comm_volume"):
        assert e["allreduce_bytes"] == P_SMALL  # every gradient, in however many buckets
        assert e["volume_source"] == "derived (ring all-reduce)"
        assert e["sent_bytes"] == int(2 * (2 - 1) / 2 * e["allreduce_bytes"])
    assert len({e["bucket_index"] for e in sink.of_type("bucket")}) > 1


@pytest.mark.slow
def test_ddp_all_reduces_only_the_trainable_gradients_of_a_frozen_body(models):
    # DDP buckets the parameters that require grad only, while the formula's P counts them all
    body, head = (64 * 32 + 32) * 4, (32 * 10 + 10) * 4
    _, ddp = run(model="frozen", mode="ddp", global_batch_size=32, steps=2, eval_every=0, step_delay_s=0)
    for e in ddp.of_type("comm_volume"):
        assert e["allreduce_bytes"] == head and e["sent_bytes"] == head  # n = 2: 2(n-1)/n = 1
        assert e["theory_sent_bytes"] == body + head


def test_dp_reduces_a_frozen_body_as_torch_nn_parallel_does(models, monkeypatch):
    # torch's Broadcast.backward -> ReduceAddCoalesced reduces a gradient for every broadcast
    # parameter (autograd materialises zeros for the frozen body's copies): the reference is that
    # path itself (dp_torch_reference), run on CPU, counting what reaches comm.reduce_add
    from dp_torch_reference import reduce_bytes_from_device_1
    from memory_models import Frozen

    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    torch_bytes, torch_buffers = reduce_bytes_from_device_1(monkeypatch, Frozen(), x, y)
    assert torch_bytes == (64 * 32 + 32 + 32 * 10 + 10) * 4 == 9_640  # body and head, by hand
    _, dp = run(model="frozen", mode="dp", global_batch_size=32, steps=2, eval_every=0, step_delay_s=0)
    phases = {(e["phase"], e["device"]): e for e in dp.of_type("dp_phase") if e["step"] == 1}
    assert phases[("broadcast", "cpu:1")]["nbytes"] == torch_bytes  # every parameter, both ways
    assert phases[("reduce", "cpu:1")]["nbytes"] == torch_bytes
    assert phases[("reduce", "cpu:1")]["copies"] == torch_buffers  # one flat buffer under 10 MiB


def test_single_reports_no_replica_verdict():
    result, sink = run(mode="single", **SMALL)
    (sync,) = sink.of_type("sync")
    assert sync["in_sync"] is None and len(sync["checksums"]) == 1
    assert result.summary["replicas_in_sync"] is None


def _train_counting(mode: str, in_place: bool, steps: int = 3, accum: int = 1):
    from memory_models import Counting

    from ddpviz.engine.modes.dp.emulated import train_dp
    from ddpviz.engine.modes.single import train_single

    cfg = RunConfig(mode=mode, steps=steps, global_batch_size=16, grad_accum_steps=accum,
                    eval_every=0, step_delay_s=0)
    ds, model = load_dataset(cfg), Counting(in_place)
    tel = Telemetry(ListSink(), "c")
    if mode == "dp":
        return train_dp(cfg, resolve_plan(cfg), ds, model, tel).calls.item()
    return train_single(cfg, ds, model, torch.device("cpu"), tel).calls.item()


def test_a_buffer_rebound_in_forward_is_lost_with_dps_replicas(models):
    assert _train_counting("single", in_place=False, accum=2) == 3 * 2  # every forward counted
    assert _train_counting("dp", in_place=False, accum=2) == 0  # rebound on replicas, thrown away
    assert _train_counting("dp", in_place=True) == 3  # device 0's replica writes the module's tensor


def _discard_logs(sink):
    return [e for e in sink.of_type("log") if "buffers_discarded" in e]


def test_dp_says_it_discarded_the_buffer_a_single_device_run_updates(models):
    # the reference: one device runs the same module and its buffer moves (one per forward)
    steps = 3
    assert _train_counting("single", in_place=False, steps=steps) == steps
    result, sink = run(model="counting", mode="dp", global_batch_size=16, steps=steps, eval_every=1,
                       step_delay_s=0)
    (log,) = _discard_logs(sink)  # once, however many steps found it
    assert log["message"] == "DP discards buffer updates made on replicas: 1 buffer(s)"
    assert log["buffers"] == ["calls"] and log["step"] == 0
    assert result.summary["buffers_discarded"] == 1
    assert [e["buffers_discarded"] for e in sink.of_type("sync")] == [1] * steps


def test_dp_reports_no_discard_when_device_0_records_the_same_update(models, monkeypatch):
    # in place on every replica: device 0's write is the module's and equals device 1's
    import memory_models

    monkeypatch.setattr(memory_models.Counting.__init__, "__defaults__", (True,))
    result, sink = run(model="counting", mode="dp", global_batch_size=16, steps=2, eval_every=1, step_delay_s=0)
    assert _discard_logs(sink) == [] and result.summary["buffers_discarded"] == 0


def _rows(sync):
    return {(b["name"], b["rank"]): b for b in sync["buffers"]}


@pytest.mark.slow
@pytest.mark.parametrize("broadcast", [True, False])
def test_ddp_shows_batchnorm_buffers_per_rank_broadcast_from_rank_0(models, broadcast):
    _, sink = run(model="bnmlp", mode="ddp", global_batch_size=32, steps=3, eval_every=1,
                  step_delay_s=0, broadcast_buffers=broadcast)
    syncs = sorted(sink.of_type("sync"), key=lambda e: e["step"])
    assert [s["step"] for s in syncs] == [0, 1, 2]
    for prev, now in zip(syncs, syncs[1:]):
        p, n = _rows(prev), _rows(now)
        for name in ("bn.running_mean", "bn.running_var"):
            for r in (0, 1):
                src = 0 if broadcast else r  # whose last step the forward starts from
                assert n[(name, r)]["at_forward_start"] == p[(name, src)]["after_step"]
            # each rank's own shard moves its statistics: after the step they differ
            assert n[(name, 0)]["after_step"] != n[(name, 1)]["after_step"]
            same_start = n[(name, 0)]["at_forward_start"] == n[(name, 1)]["at_forward_start"]
            assert same_start is broadcast


def test_ddp_takes_the_buffer_setting_without_torchs_deprecation_warning():
    """torch 2.13 warns "`broadcast_buffers` is deprecated" on every rank given that keyword, True or False (it was
    in every launched rank's output); `buffer_sync_arg` gives DDP the same setting without it."""
    import warnings

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddpviz.engine.components.ports import free_port
    from ddpviz.engine.modes.ddp.buckets import buffer_sync_arg

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        for flag in (True, False):
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                ddp = DDP(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)), **buffer_sync_arg(flag))
            assert ddp.broadcast_buffers is flag
    finally:
        dist.destroy_process_group()
