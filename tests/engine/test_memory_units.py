"""The measuring parts on their own: the live-tensor ledger, NVML by UUID, the sampler's pieces.

References are hand-worked: bytes = numel x element size of tensors made here; NVML figures are
a fake NVML's own table (no GPU here), ordered the way a lease orders them.
"""

import threading
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from ddpviz.engine.measure.ledger import LedgerMode, TensorLedger
from ddpviz.engine.measure.memory import NvmlReader
from ddpviz.engine.measure.memory_sampler import downsample, should_trace_memory


def test_ledger_counts_each_threads_storages_on_its_device_and_drops_them_when_freed():
    led = TensorLedger(2)
    led.begin()
    kept = {}

    def device(i, make):
        with LedgerMode(led, device=i):
            kept[i] = make()

    t = threading.Thread(target=device, args=(1, lambda: [torch.empty(500)]))  # 2,000 B
    with LedgerMode(led, device=0):
        a = torch.empty(1000)  # 4,000 B
        v = a.view(10, 100)  # a view: no new storage
        c = torch.empty(250, dtype=torch.float64)  # 2,000 B
        t.start()
        t.join()
    assert led.totals == [6000, 2000]
    del c
    assert led.totals == [4000, 2000]
    assert led.peaks == [6000, 2000]
    del kept[1]
    assert led.totals == [4000, 0]
    led.end()
    del a, v


def test_the_peak_is_the_maximum_even_when_it_lasts_between_two_readings():
    led = TensorLedger(1)
    led.begin()
    with LedgerMode(led):
        big = torch.ones(250_000)  # 1,000,000 B, freed before anyone could read it
        del big
        small = torch.ones(1000)
    assert led.totals == [4000] and led.peaks == [1_000_000]
    assert max(b for _, b in led.points[0]) == 1_000_000
    del small


def test_existing_tensors_count_once_and_backward_is_seen_and_filed():
    lin = nn.Linear(100, 50)  # weight 20,000 B + bias 200 B
    led = TensorLedger(1)
    led.begin()
    led.add_existing(lin.parameters(), "params")
    led.add_existing(lin.parameters(), "params")  # again: still once
    assert led.breakdown(0) == {"params": 20_200}
    x = torch.randn(8, 100)
    with LedgerMode(led):
        lin(x).sum().backward()  # the backward runs in this thread: the mode sees it
    led.retag([lin.weight.grad, lin.bias.grad], "grads")
    bd = led.breakdown(0)
    assert bd["params"] == 20_200 and bd["grads"] == 20_200
    assert led.peak_kinds[0].get("grads") == 20_200  # alive at the peak: the peak's breakdown too


def test_a_cuda_ledger_ignores_cpu_tensors():
    led = TensorLedger(1, device_type="cuda")
    led.begin()
    with LedgerMode(led):
        x = torch.empty(1000)
    assert led.totals == [0]
    del x


class FakeNvml:
    """NVML as the driver numbers GPUs (PCI order): index 0 is GPU-aaa, index 1 GPU-bbb."""

    def __init__(self):
        self.used = {"GPU-aaaaaaaa-0000-0000-0000-000000000000": 1 << 30,
                     "GPU-bbbbbbbb-0000-0000-0000-000000000000": 5 << 30,
                     "MIG-cccccccc-0000-0000-0000-000000000000": 7 << 30}
        self.by_index = list(self.used)

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.used:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return uuid

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.by_index[index]

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=self.used[handle], total=80 << 30)


def test_nvml_figures_come_from_the_same_physical_gpu_under_a_lease():
    # CUDA_VISIBLE_DEVICES=GPU-bbb...,GPU-aaa...: CUDA's ordinal 0 is NVML's index 1
    cuda_uuids = {0: "bbbbbbbb-0000-0000-0000-000000000000", 1: "aaaaaaaa-0000-0000-0000-000000000000",
                  2: "cccccccc-0000-0000-0000-000000000000"}
    reader = NvmlReader(nvml=FakeNvml(), uuid_of=cuda_uuids.__getitem__)
    assert reader.used_bytes(0) == 5 << 30
    assert reader.used_bytes(1) == 1 << 30
    assert reader.used_bytes(2) == 7 << 30  # a MIG instance: NVML names it MIG-<uuid>


def test_nvml_without_a_match_or_without_nvml_gives_none():
    assert NvmlReader(nvml=FakeNvml(), uuid_of=lambda i: "dddddddd-0000").used_bytes(0) is None

    class Broken(FakeNvml):
        def nvmlInit(self):
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")
    assert NvmlReader(nvml=Broken(), uuid_of=lambda i: "x").used_bytes(0) is None


def test_downsample_keeps_the_peak_the_ends_and_the_order():
    pts = [(i * 1e-4, (i * 37) % 1000) for i in range(5000)] + [(0.5, 123)]
    pts[2345] = (pts[2345][0], 99_999)
    out = downsample(pts, 240)
    assert len(out) <= 240
    assert out[0] == [0.0, 0] and out[-1] == [0.5, 123]
    assert max(b for _, b in out) == 99_999
    assert [t for t, _ in out] == sorted(t for t, _ in out)


@pytest.mark.parametrize("steps,traced", [
    (5, [0, 1, 2, 4]),
    (300, [0, 1, 2, 200, 299]),  # never two within 200 steps (but the last)
    (3000, [0, 1, 2] + list(range(200, 3000, 200)) + [2999]),  # every 200th: 14 more
    (8000, [0, 1, 2] + list(range(400, 8000, 400)) + [7999]),  # 20 more over a long run
])
def test_which_steps_are_traced(steps, traced):
    assert [s for s in range(steps) if should_trace_memory(s, steps)] == traced


def test_ledger_counts_a_sparse_gradient_by_its_indices_and_values_and_retags_it():
    """An nn.Embedding(sparse=True) gradient is a sparse COO tensor (no plain storage): its bytes
    are its int64 indices and its values. Hand-worked: 3 looked-up rows of 4 floats = 48 B of
    values + 3 x 8 B of indices = 24 B; 72 B in all. Made in backward under the ledger, it is
    counted there (kind "backward") and once only; retagged, its bytes move to "grads"."""
    led = TensorLedger(1)
    led.begin()
    emb = nn.Embedding(10, 4, sparse=True)
    with LedgerMode(led, device=0):
        emb(torch.tensor([1, 5, 7])).sum().backward()
    g = emb.weight.grad
    assert g.layout == torch.sparse_coo
    assert led.kind_of(g) == "backward" and led.breakdown(0) == {"backward": 72}
    led.add(g, "activations")  # already counted: no second count, no change of kind
    assert led.breakdown(0) == {"backward": 72}
    led.retag([g], "grads")
    assert led.kind_of(g) == "grads" and led.breakdown(0) == {"grads": 72}
    led.end()


def test_ledger_adds_a_sparse_gradient_made_outside_it_by_its_indices_and_values():
    """The same gradient made before the ledger watched: `add` counts its 72 B (48 values + 24
    indices), once."""
    emb = nn.Embedding(10, 4, sparse=True)
    emb(torch.tensor([1, 5, 7])).sum().backward()
    led = TensorLedger(1)
    led.begin()
    led.add(emb.weight.grad, "grads")
    led.add(emb.weight.grad, "grads")
    assert led.breakdown(0) == {"grads": 72}
    led.end()


def test_a_storage_resized_in_place_is_counted_at_each_resize():
    """FSDP2 frees and re-allocates gathered parameters with `UntypedStorage.resize_`, which no op
    shows: `resized` re-reads the bytes (hand-worked: 1,000 float32 = 4,000 B)."""
    led = TensorLedger(1)
    gathered = torch.empty(1000)
    gathered.untyped_storage().resize_(0)  # as FSDP2 leaves it between steps
    led.begin()
    with LedgerMode(led):
        led.resized([gathered], "unsharded_params")
        assert led.totals == [0]  # nothing held yet
        gathered.untyped_storage().resize_(4000)
        led.resized([gathered], "unsharded_params")
        assert led.totals == [4000] and led.breakdown(0) == {"unsharded_params": 4000}
        gathered.untyped_storage().resize_(0)
        led.resized([gathered], "unsharded_params")
        other = torch.empty(500)  # 2,000 B
        gathered.untyped_storage().resize_(4000)
        led.resized([gathered], "unsharded_params")
    assert led.totals == [6000] and led.peaks == [6000]
    del other
    gathered.untyped_storage().resize_(0)
    led.resized([gathered], "unsharded_params")
    assert led.totals == [0] and led.peaks == [6000]
    led.end()


def test_a_dtensor_is_counted_by_its_local_shard():
    """What FSDP2's parameters, gradients and optimizer state are (a 1-rank mesh here)."""
    import torch.distributed as dist
    import torch.distributed.nn.functional  # noqa: F401  before any group (see engine.modes.ranks)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    if dist.is_initialized():
        pytest.skip("a process group exists already")
    from ddpviz.engine.modes.launcher import free_port
    from ddpviz.engine.modes.ranks import leave_process_group

    # the store's address in the call, not in os.environ (tests/engine/test_rank_environ.py)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        # rank 0's third of a (300, 10) parameter, as on 3 ranks: 4,000 B local; the DTensor
        # wrapper itself reports a storage of the global 12,000 B, which nothing allocated
        d = DTensor.from_local(torch.ones(100, 10), mesh, [Shard(0)], run_check=False,
                               shape=torch.Size([300, 10]), stride=(10, 1))
        led = TensorLedger(1)
        led.begin()
        led.add_existing([d], "params")
        assert led.totals == [4000]
        with LedgerMode(led):
            twice = d * 2  # a DTensor op: its output's local shard is a new 4,000 B
        assert led.totals == [8000]
        del twice
        assert led.totals == [4000]
        led.end()
    finally:
        leave_process_group()


def test_an_op_writing_into_a_storage_resized_since_it_was_counted_recounts_it():
    """World size 1: FSDP2 re-allocates with a bare `resize_` and then copies into it (`copy_`),
    so the op's output is where the ledger learns the new size."""
    led = TensorLedger(1)
    led.begin()
    with LedgerMode(led):
        buf = torch.zeros(1000)  # 4,000 B
        buf.untyped_storage().resize_(0)
        led.resized([buf], "unsharded_params")
        assert led.totals == [0]
        buf.untyped_storage().resize_(4000)
        buf.copy_(torch.ones(1000))  # + the 4,000 B source
    assert led.totals == [4000] and led.peaks == [8000]
    del buf
    assert led.totals == [0]
    led.end()


def test_a_traced_step_s_window_after_its_last_phase_is_the_instrument_s_phase():
    """A traced step whose window runs 30 ms past the step's own end (as a sampled step's profiler
    read does): the memory event's phases end with `AFTER_STEP_PHASE` from the optimizer's end to
    the window's end, so the curve's tail is not read as training."""
    import time

    from ddpviz.engine.events import AFTER_STEP_PHASE, ListSink
    from ddpviz.engine.measure.memory_sampler import DeviceProbe, MemorySampler
    from ddpviz.engine.measure.telemetry import Telemetry, now, step_fields

    sink = ListSink()
    tel = Telemetry(sink, "r", device="cpu:0")
    sampler = MemorySampler(tel, [DeviceProbe("cpu:0", ledger_index=0)], steps=1, ledger=TensorLedger(1),
                            interval_s=10.0)

    def train_step(step):
        start = now()
        time.sleep(0.01)
        fields = step_fields(loss=1.0, samples=8, step_time_s=0.01, forward_s=0.004, backward_s=0.004,
                             comm_exposed_s=0.0, optimizer_s=0.002, start=start)
        time.sleep(0.03)  # the instrument's work after the step, inside the traced window
        return fields

    try:
        sampler.wrap(train_step)(0)
    finally:
        sampler.close()
    mem = next(e for e in sink.events if e["type"] == "memory")
    names = [name for name, _, _ in mem["phases"]]
    assert names == ["forward", "backward", "optimizer", AFTER_STEP_PHASE]
    opt_end = mem["phases"][2][2]
    _, tail_start, tail_end = mem["phases"][3]
    assert tail_start == opt_end  # from the step's last phase ...
    assert tail_end == pytest.approx(mem["step_span_s"], abs=1e-6)  # ... to the window's end
    assert tail_end - tail_start >= 0.03


def test_every_tensor_an_op_returns_in_a_tuple_is_counted():
    """aten.native_layer_norm returns (out, mean, rstd), three new storages: 4x8, 4x1, 4x1 float32 =
    128 + 16 + 16 bytes, counted by hand; torch.sort a named tuple (values, indices): 40 + 80."""
    led = TensorLedger(1)
    x, w, b = torch.randn(4, 8), torch.ones(8), torch.zeros(8)
    v = torch.randn(10)
    led.begin()
    with LedgerMode(led, device=0):
        kept = torch.ops.aten.native_layer_norm(x, [8], w, b, 1e-5)
        after_norm = led.totals[0]
        kept_sort = torch.sort(v)
    led.end()
    assert after_norm == 128 + 16 + 16
    assert led.peaks[0] == 128 + 16 + 16 + 10 * 4 + 10 * 8
    del kept, kept_sort
