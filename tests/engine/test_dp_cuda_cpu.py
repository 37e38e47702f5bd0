"""engine/modes/dp/cuda.py's step, hooks and thread runner, run on CPU with torch.nn.parallel's copies
faked (tests/engine/dp_cpu_fakes.py) and host-clock marks instead of CUDA events.

References: plain single-device training on the same micro-batches (numerics), bytes worked out
by hand from the model's shapes, and torch.autocast's documented dtype (amp).
"""

import threading

import pytest
import torch
import torch.nn as nn
from dp_cpu_fakes import cpu_parallel

from ddpviz.engine.components.training import loss_fn, make_optimizer
from ddpviz.engine.config import RunConfig
from ddpviz.engine.events import ListSink
from ddpviz.engine.measure.telemetry import Telemetry
from ddpviz.engine.modes.dp.book import SpanBook
from ddpviz.engine.modes.dp.cuda import CudaDP
from ddpviz.engine.modes.dp.hooks import HostClock, apply_in_threads

CFG = RunConfig(mode="dp", world_size=2, global_batch_size=16, grad_accum_steps=2, lr=0.1, optimizer="sgd", step_delay_s=0)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def batches(steps: int):
    g = torch.Generator().manual_seed(1)
    return [[(torch.randn(8, 64, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(2)]
            for _ in range(steps)]


def run_dp(monkeypatch, model, data, cfg=CFG):
    with cpu_parallel(monkeypatch):
        dp = CudaDP(cfg, model, cfg.world_size, device_type="cpu", clock=HostClock())
        opt = make_optimizer(cfg, model.parameters())
        return dp, [dp.step(iter(micro), opt) for micro in data]


def test_dp_step_matches_single_device_training_with_grad_accumulation(monkeypatch):
    data = batches(3)
    dp_model, single = mlp(), mlp()
    run_dp(monkeypatch, dp_model, data)
    opt = make_optimizer(CFG, single.parameters())
    for micro in data:
        for x, y in micro:
            (loss_fn(single(x), y) / 2).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    for a, b in zip(dp_model.parameters(), single.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_every_device_and_micro_step_gets_its_own_spans_in_dp_order(monkeypatch):
    _, (rec,) = run_dp(monkeypatch, mlp(), batches(1))
    keys = [(s.phase, s.device, s.micro) for s in rec.spans]
    per_device = ("broadcast", "scatter", "forward", "gather", "backward", "reduce")
    expected = {(p, d, m) for p in per_device for d in (0, 1) for m in (0, 1)}
    expected |= {("loss", 0, 0), ("loss", 0, 1), ("optimizer", 0, 0)}
    assert sorted(keys) == sorted(expected)  # 2 micro-steps x (6 phases x 2 devices + loss) + optimizer
    span = {k: s for k, s in zip(keys, rec.spans)}
    assert all(s.start_s <= s.end_s for s in rec.spans)
    for m in (0, 1):
        for d in (0, 1):  # each device: copies in, forward, then its backward after the loss
            assert span[("broadcast", d, m)].end_s <= span[("scatter", d, m)].start_s
            assert span[("scatter", d, m)].end_s <= span[("forward", d, m)].start_s
            assert span[("loss", 0, m)].end_s <= span[("backward", d, m)].start_s
            assert span[("backward", d, m)].end_s <= span[("reduce", d, m)].start_s
    assert span[("reduce", 0, 0)].end_s <= span[("broadcast", 0, 1)].start_s  # micro 1 follows micro 0
    assert span[("reduce", 0, 1)].end_s <= span[("optimizer", 0, 0)].start_s


def test_step_figures_sum_both_micro_steps(monkeypatch):
    _, (rec,) = run_dp(monkeypatch, mlp(), batches(1))
    m = rec.measures(16)
    fwd = [s.end_s - s.start_s for s in rec.spans if s.phase == "forward" and s.device == 0]
    red = [s.end_s - s.start_s for s in rec.spans if s.phase == "reduce" and s.device == 0]
    assert len(fwd) == 2 and m["forward_s"] == pytest.approx(sum(fwd))
    assert m["comm_exposed_s"] >= sum(red) > 0  # the reduce counts as communication


def test_bytes_moved_by_hand(monkeypatch):
    # P = (64*32 + 32 + 32*10 + 10) * 4 B = 9640 B; per device and micro-step 4 samples:
    # input chunk 4*64*4 = 1024 B, output 4*10*4 = 160 B, d loss/d output 160 B.
    # Per micro-step device 0 sends 9640 (broadcast) + 1024 (scatter) + 160 (output grads) = 10824
    # and receives 160 (gather) + 9640 (reduce) = 9800; device 1 the mirror image. Two micro-steps.
    _, (rec,) = run_dp(monkeypatch, mlp(), batches(1))
    assert rec.traffic.sent == [2 * 10824, 2 * 9800]
    assert rec.traffic.recv == [2 * 9800, 2 * 10824]
    nb = rec.traffic.span_nbytes
    assert nb[("broadcast", 1, 1)] == 9640 and nb[("scatter", 1, 0)] == 1024
    assert nb[("gather", 0, 0)] == 160 and nb[("reduce", 0, 1)] == 9640
    sink = ListSink()
    rec.emit(Telemetry(sink, "t"), 0, ["cuda:0", "cuda:1"], theory=[19280, 19280])
    vol = {e["device"]: e for e in sink.of_type("comm_volume")}
    assert vol["cuda:1"]["recv_bytes"] == 21648 and vol["cuda:1"]["theory_recv_bytes"] == 19280
    assert vol["cuda:0"]["volume_source"].startswith("measured")


def test_events_md_names_the_field_and_value_dp_on_gpu_emits():
    """docs/events.md's "DP on GPU" paragraph, the emitter and tests/engine/test_gpu.py agree on
    `volume_source` (the GPU test once read a `source` that `comm_volume` never carried)."""
    from pathlib import Path

    from ddpviz.engine.modes.dp.cuda import COMM_SOURCE

    root = Path(__file__).resolve().parents[2]
    assert f'`volume_source` = `"{COMM_SOURCE}"`' in (root / "docs" / "events.md").read_text()
    gpu_test = (root / "tests" / "engine" / "test_gpu.py").read_text()
    assert 'e["volume_source"].startswith("measured")' in gpu_test
    assert 'e["source"].startswith("counted")' not in gpu_test


def test_tied_gpt_broadcasts_each_tensor_once_and_matches_single(monkeypatch):
    from ddpviz.engine.data import load_dataset
    from ddpviz.engine.models import build_model

    cfg = RunConfig(mode="dp", model="gpt", dataset="text", width=32, depth=2, n_head=2, block_size=16,
                    world_size=2, global_batch_size=4, lr=0.01, optimizer="sgd", step_delay_s=0)
    ds = load_dataset(cfg)
    torch.manual_seed(0)
    model = build_model(cfg, ds)
    torch.manual_seed(0)
    single = build_model(cfg, ds)
    data = [[(ds.x_train[:4], ds.y_train[:4])]]
    dp, (rec,) = run_dp(monkeypatch, model, data, cfg)
    master = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    master_bytes = sum(t.numel() * t.element_size() for t in master.values())  # parameters() counts tied once
    assert rec.traffic.recv[1] >= master_bytes and rec.traffic.span_nbytes[("broadcast", 1, 0)] == master_bytes
    opt = make_optimizer(cfg, single.parameters())
    loss_fn(single(ds.x_train[:4]), ds.y_train[:4]).backward()
    opt.step()
    for a, b in zip(model.parameters(), single.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_the_check_reads_the_replicas_this_step_built(monkeypatch):
    # the checksums come from the step's own replicas: a broadcast that delivered other values to
    # device 1 shows in them (a check on fresh replicas outside the step would not see it)
    from dp_cpu_fakes import CpuBroadcast

    class Corrupting(CpuBroadcast):
        @staticmethod
        def forward(ctx, target_gpus, *inputs):
            outs = CpuBroadcast.forward(ctx, target_gpus, *inputs)
            return tuple(o if i < len(inputs) else o.detach().add(1e-3) for i, o in enumerate(outs))

    model, cfg = mlp(), CFG.model_copy(update={"grad_accum_steps": 1, "global_batch_size": 8})
    data = [[batches(1)[0][0]]]
    with cpu_parallel(monkeypatch):
        dp = CudaDP(cfg, model, 2, device_type="cpu", clock=HostClock())
        opt = make_optimizer(cfg, model.parameters())
        dp.check = True
        dp.step(iter(data[0]), opt)
        good = dp.checksums_seen
        monkeypatch.setattr(torch.nn.parallel._functions, "Broadcast", Corrupting)
        dp.step(iter(data[0]), opt)
        bad = dp.checksums_seen
    assert good[0] == good[1]
    assert bad[0] != bad[1]


class Probe(nn.Linear):
    """A Linear that records (thread name, output dtype) of every call."""

    seen: list = []

    def forward(self, x):
        out = super().forward(x)
        Probe.seen.append((threading.current_thread().name, out.dtype))
        return out


def probe_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(Probe(64, 10))


def test_thread_runner_enters_the_callers_autocast_dtype_in_each_thread():
    # fp16 is not the CPU threads' default autocast dtype (bf16), so only an explicit dtype gives it
    Probe.seen = []
    model = probe_model()
    x = torch.randn(8, 64)
    apply_in_threads([model, model], [x[:4], x[4:]], device_type="cpu", micro=0, book=SpanBook(),
                     clock=HostClock(), amp=lambda: torch.autocast("cpu", dtype=torch.float16))
    assert sorted(Probe.seen) == [("dp-device-0", torch.float16), ("dp-device-1", torch.float16)]


def test_amp_runs_bf16_inside_every_replica_of_the_cuda_dp_step(monkeypatch):
    Probe.seen = []
    cfg = CFG.model_copy(update={"amp": True, "grad_accum_steps": 1})
    run_dp(monkeypatch, probe_model(), [[(torch.randn(8, 64), torch.randint(0, 10, (8,)))]], cfg)
    assert sorted(Probe.seen) == [("dp-device-0", torch.bfloat16), ("dp-device-1", torch.bfloat16)]


def test_amp_runs_bf16_inside_every_replica_of_the_emulated_dp():
    from ddpviz.engine.components.devices import resolve_plan
    from ddpviz.engine.data import load_dataset
    from ddpviz.engine.modes.dp.emulated import train_dp

    Probe.seen = []
    cfg = RunConfig(mode="dp", world_size=2, amp=True, steps=1, eval_every=0, step_delay_s=0,
                    global_batch_size=16, device="cpu")
    train_dp(cfg, resolve_plan(cfg), load_dataset(cfg), probe_model(), Telemetry(ListSink(), "t"))
    in_devices = [(name, dtype) for name, dtype in Probe.seen if name.startswith("dp-device")]
    assert len(in_devices) == 2, Probe.seen  # one forward per device, in the device threads (a pool)
    assert {dtype for _, dtype in in_devices} == {torch.bfloat16}


def two_replica_graph():
    """w (4 floats) and v (8 floats) broadcast to devices 0 and 1; device 1 never uses v.
    Device 1's ops are created after device 0's, so CPU autograd (highest sequence number first)
    runs device 1's backward completely before device 0's."""
    from dp_cpu_fakes import CpuBroadcast

    w, v = torch.ones(4, requires_grad=True), torch.ones(8, requires_grad=True)
    w0, v0, w1, v1 = CpuBroadcast.apply([0, 1], w, v)
    out0 = (w0 * 2).sum() + (v0 * 3).sum()
    out1 = (w1 * 5).exp().sum()
    return (w, v), (out0, out1), w0.grad_fn


def test_backward_ends_when_that_devices_last_gradient_is_handed_over():
    from ddpviz.engine.modes.dp.hooks import mark_backward

    (w, v), outs, node = two_replica_graph()
    book, clock = SpanBook(), HostClock()
    clock.begin([0, 1])
    mark_backward(outs, node, book, clock, 0)
    (outs[0] + outs[1]).backward()
    span = {s.device: s for s in book.resolve(clock.seconds)}
    assert span[1].end_s <= span[0].start_s  # device 1 was done before device 0 began
    torch.testing.assert_close(w.grad, torch.full((4,), 2.0) + 5 * torch.exp(torch.tensor(5.0)))


def test_reduce_is_marked_on_every_device_and_counts_what_device_1_sends():
    from ddpviz.engine.modes.dp.book import StarTraffic
    from ddpviz.engine.modes.dp.hooks import mark_reduce

    _, outs, node = two_replica_graph()
    book, clock, traffic = SpanBook(), HostClock(), StarTraffic(2)
    clock.begin([0, 1])
    mark_reduce(node, 2, book, clock, 0, traffic, nbytes_if_none=[16, 32])
    (outs[0] + outs[1]).backward()
    assert {(s.phase, s.device) for s in book.resolve(clock.seconds)} == {("reduce", 0), ("reduce", 1)}
    # device 1 sends w's gradient (16 B) and v's, which autograd reduces as zeros (32 B)
    assert traffic.sent == [0, 48] and traffic.recv == [48, 0]


def test_a_sampled_step_resets_every_devices_peak_before_its_first_copy(monkeypatch):
    # torch.cuda.max_memory_allocated is the process's maximum unless reset: the step must reset
    # each device's peak before any of its work (here: before the broadcast's first copy)
    from dp_cpu_fakes import CpuBroadcast

    order = []

    class Watching(CpuBroadcast):
        @staticmethod
        def forward(ctx, target_gpus, *inputs):
            order.append("broadcast")
            return CpuBroadcast.forward(ctx, target_gpus, *inputs)

    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d: order.append(("reset", d)))
    model = mlp()
    with cpu_parallel(monkeypatch):
        monkeypatch.setattr(torch.nn.parallel._functions, "Broadcast", Watching)
        dp = CudaDP(CFG, model, 2, device_type="cpu", clock=HostClock())
        opt = make_optimizer(CFG, model.parameters())
        dp.step(iter(batches(1)[0]), opt, reset_peaks=True)
        assert order[:3] == [("reset", 0), ("reset", 1), "broadcast"]
        order.clear()
        dp.step(iter(batches(1)[0]), opt)  # a step that is not sampled keeps the allocator's state
        assert ("reset", 0) not in order and order.count("broadcast") == 2


def test_gpu_dp_refuses_a_fault_it_cannot_inject_before_launch(monkeypatch):
    from ddpviz.engine.components.devices import PreflightError, resolve_plan
    from ddpviz.engine.config import validate_config

    with pytest.raises(ValueError, match="fault 'raise' is not injected by DP on CUDA"):
        validate_config(dict(mode="dp", device="cuda", world_size=2, fault="raise", fault_step=0))
    # device 'auto' picks CUDA at pre-flight, where the same rule refuses it, naming the field
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(PreflightError) as err:
        resolve_plan(validate_config(dict(mode="dp", world_size=2, fault="diverge", fault_rank=1)))
    assert err.value.field == "fault" and "fault 'diverge'" in str(err.value)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "fake")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), {"total_memory": 1})())
    assert resolve_plan(validate_config(dict(mode="ddp", world_size=2, fault="diverge"))).kind == "cuda"


class LateStreamClock:
    """`engine.modes.dp.hooks.CudaStreamClock`'s interface as GPUs behind the host keep it: a mark completes
    once `LAG` more marks were made (on any device) or at a `synchronize` (counted); a read of an incomplete
    mark raises, as `Event.elapsed_time` does; `done` never waits."""

    LAG = 30  # fewer than one step's marks (2 micro-steps: ~56), so a step completes while the next is issued

    def __init__(self):
        import itertools

        self._ids, self.made, self.synced, self.syncs = itertools.count(1), 0, 0, 0

    def begin(self, devices):
        self.origin = self.mark(0)

    def mark(self, device):
        import time

        self.made = n = next(self._ids)
        return (time.perf_counter(), n)

    def _complete(self, mark) -> bool:
        return mark[1] <= self.synced or self.made - mark[1] >= self.LAG

    def done(self, mark) -> bool:
        return self._complete(mark)

    def synchronize(self, devices):
        self.syncs += 1
        self.synced = self.made

    def frozen(self):
        origin = self.origin

        def seconds(device, mark):
            if not (self._complete(origin) and self._complete(mark)):
                raise RuntimeError("a mark was read before it completed")
            return mark[0] - origin[0]
        return seconds


def test_a_dp_step_issued_without_a_synchronize_reads_the_same_record_once_its_marks_completed(monkeypatch):
    """`CudaDP.issue` (a DP step on CUDA, read late: no synchronize): not ready while its marks are pending, its
    spans from its own step's origins once they completed (after the next step began), and the same loss, bytes and
    spans as the same steps read at once after a synchronize (`step`)."""
    data = batches(3)
    _, at_once = run_dp(monkeypatch, mlp(), data)
    model, clock = mlp(), LateStreamClock()
    with cpu_parallel(monkeypatch):
        dp = CudaDP(CFG, model, CFG.world_size, device_type="cpu", clock=clock)
        opt = make_optimizer(CFG, model.parameters())
        issued = []
        for micro in data:
            issued.append(dp.issue(iter(micro), opt))
            assert not issued[-1].ready()  # its last marks are not LAG marks old yet
            with pytest.raises(RuntimeError, match="before it completed"):
                issued[-1].record()
        last = issued[-1]  # ready once every device's end completed, not device 0's alone
        while not clock.done(last.ends[0]):
            clock.mark(0)
        assert not clock.done(last.ends[-1]) and not last.ready()
        clock.mark(0)
        assert last.ready()
        dp.clock.synchronize(dp.ids)  # after the last step, as the run's end
    assert clock.syncs == 1 and issued[0].ready() and issued[1].ready()
    late = [i.record() for i in issued]
    for a, b in zip(late, at_once):
        assert a.loss == b.loss
        assert a.traffic.sent == b.traffic.sent and a.traffic.span_nbytes == b.traffic.span_nbytes
        assert [(s.phase, s.device, s.micro) for s in a.spans] == [(s.phase, s.device, s.micro) for s in b.spans]
        # each step's spans from its own origin (not the next step's): inside [0, its wall time]
        assert all(0 <= s.start_s <= s.end_s <= a.step_time_s + 1e-9 for s in a.spans)
        assert a.step_time_s == max(s.end_s for s in a.spans if s.phase == "optimizer")
