"""DP's CPU copies against torch.nn.parallel's own functions (torch/nn/parallel/comm.py,
scatter_gather.py, torch/_utils.py), run on CPU tensors where they run.

References: `_take_tensors` (the chunks comm.broadcast_coalesced / reduce_add_coalesced make),
`_flatten_dense_tensors` (the flat buffer's layout and size), `scatter_gather.gather` (the walk
over the output structure, with only `Gather`'s CUDA copy replaced by a concatenation), plain
sums worked by hand, and a single-device run of the same module.
"""

from collections import namedtuple

import pytest
import torch
import torch.nn as nn
from torch._utils import _flatten_dense_tensors, _take_tensors
from torch.nn.parallel import scatter_gather

from ddpviz.engine.modes.dp.comm import (
    BUFFER_SIZE_BYTES,
    broadcast_coalesced,
    coalesced_chunks,
    gather_outputs,
    reduce_add_coalesced,
)

MiB = 1024 * 1024


def _mixed():
    """Three 4 MiB float32 tensors, a small float64 one between them, a small float32 one."""
    g = torch.Generator().manual_seed(0)
    return [torch.randn(MiB, generator=g), torch.randn(MiB, generator=g),
            torch.randn(8, dtype=torch.float64, generator=g), torch.randn(MiB, generator=g),
            torch.randn(3, 5, generator=g)]


def test_the_buffer_is_torchs_10_mib_and_chunks_are_take_tensors_chunks():
    from torch.nn.parallel import comm
    import inspect

    default = inspect.signature(comm.broadcast_coalesced).parameters["buffer_size"].default
    reduce_default = inspect.signature(comm.reduce_add_coalesced).parameters["buffer_size"].default
    assert BUFFER_SIZE_BYTES == default == reduce_default
    ts = _mixed()
    ours = coalesced_chunks(ts)
    theirs = [[next(k for k, t in enumerate(ts) if t is c) for c in chunk] for chunk in _take_tensors(ts, default)]
    assert ours == theirs
    # by hand: 4 + 4 MiB fit in 10 MiB, the third 4 MiB tensor starts a new float32 chunk (with
    # the small float32 one); the float64 tensor is a chunk of its own dtype
    assert sorted(map(sorted, ours)) == [[0, 1], [2], [3, 4]]


def test_broadcast_copies_one_flat_buffer_per_chunk_and_device():
    ts = _mixed()
    out, copies = broadcast_coalesced(ts, 3, leaf=lambda k: k == 0)
    chunks = [list(c) for c in _take_tensors(ts, BUFFER_SIZE_BYTES)]
    assert [c.device for c in copies] == [j for _ in chunks for j in (1, 2)]
    flat_bytes = [_flatten_dense_tensors(c).numel() * _flatten_dense_tensors(c).element_size() for c in chunks]
    assert [c.nbytes for c in copies] == [b for b in flat_bytes for _ in (1, 2)]
    assert sum(c.nbytes for c in copies if c.device == 1) == sum(t.numel() * t.element_size() for t in ts)
    assert out[0] == ts  # device 0 keeps its own tensors
    for j in (1, 2):
        for k, t in enumerate(ts):
            assert torch.equal(out[j][k], t) and out[j][k].data_ptr() != t.data_ptr()
        # one storage per chunk on each device: views of the one buffer that crossed
        storages = {out[j][k].untyped_storage().data_ptr() for k in (0, 1)}
        assert len(storages) == 1
        assert out[j][0].requires_grad and out[j][0].is_leaf and not out[j][1].requires_grad


def test_reduce_sums_every_parameter_with_zeros_for_missing_gradients():
    like = [torch.zeros(4), torch.zeros(2, 3), torch.zeros(5)]
    g1 = [torch.ones(4), None, torch.full((5,), 2.0)]
    g2 = [torch.full((4,), 3.0), torch.ones(2, 3), None]
    sums, copies = reduce_add_coalesced([g1, g2], like)
    torch.testing.assert_close(sums[0], torch.full((4,), 4.0))
    torch.testing.assert_close(sums[1], torch.ones(2, 3))
    torch.testing.assert_close(sums[2], torch.full((5,), 2.0))
    # every parameter crosses from each device, got a gradient or not: one flat buffer each
    assert [(c.device, c.nbytes) for c in copies] == [(1, 15 * 4), (2, 15 * 4)]


class _CpuGather(torch.autograd.Function):
    """`Gather` with its CUDA copy replaced by a concatenation (scalars as vectors, as it does)."""

    @staticmethod
    def forward(ctx, target_device, dim, *inputs):
        if all(t.dim() == 0 for t in inputs):
            inputs = tuple(t.view(1) for t in inputs)
        return torch.cat(inputs, dim)


Pair = namedtuple("Pair", "a b")


def _outputs(j):
    g = torch.Generator().manual_seed(j)
    return {"logits": torch.randn(4, 3, generator=g), "aux": Pair(torch.randn(4, generator=g), None),
            "loss": torch.tensor(float(j)), "list": [torch.randn(4, 2, generator=g)]}


def test_gather_walks_the_output_like_torch_and_copies_every_tensor(monkeypatch):
    outs = [_outputs(0), _outputs(1)]
    monkeypatch.setattr(scatter_gather, "Gather", _CpuGather)
    theirs = scatter_gather.gather(outs, "cpu")
    ours = gather_outputs(outs)
    assert type(ours.output) is dict and list(ours.output) == list(theirs)
    assert isinstance(ours.output["aux"], Pair) and ours.output["aux"].b is None
    flat_t, spec_t = torch.utils._pytree.tree_flatten(theirs)
    flat_o, spec_o = torch.utils._pytree.tree_flatten(ours.output)
    assert spec_o == spec_t
    assert len(flat_o) == len(flat_t) == 5 and [a is None for a in flat_o] == [b is None for b in flat_t]
    for a, b in zip(flat_o, flat_t):
        if a is not None:
            torch.testing.assert_close(a.detach(), b)
    # device 1 sent every tensor of its output, one copy each
    device1 = [t for t in torch.utils._pytree.tree_leaves(outs[1]) if isinstance(t, torch.Tensor)]
    assert sorted(c.nbytes for c in ours.copies) == sorted(t.numel() * t.element_size() for t in device1)
    assert {c.device for c in ours.copies} == {1}


class _TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(64, 16)
        self.head = nn.Linear(16, 10)
        self.unused = nn.Linear(3, 3)  # requires grad, never used in forward

    def forward(self, x):
        h = torch.relu(self.body(x))
        return {"logits": self.head(h), "hidden": h}


def _dp_step(model, x, y, n=2):
    from ddpviz.engine.config import RunConfig
    from ddpviz.engine.modes.dp.emulated import EmulatedDP, PhaseLog
    from ddpviz.engine.measure.telemetry import now

    dp = EmulatedDP(RunConfig(mode="dp", world_size=n, global_batch_size=len(x), eval_every=0), model, n)
    log = PhaseLog(now())
    try:
        dp.micro_step(x, y, log, accum=1, step=0, micro=0)
    finally:
        dp.pool.shutdown(wait=True)
    return dp, log


def test_emulated_dp_gathers_the_whole_output_and_matches_a_single_device_step():
    torch.manual_seed(0)
    model = _TwoHeads()
    ref = _TwoHeads()
    ref.load_state_dict(model.state_dict())
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    dp, log = _dp_step(model, x, y)
    nn.functional.cross_entropy(ref(x)["logits"], y).backward()  # one device, the same batch
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        if name.startswith("unused"):
            # torch's reduce hands a parameter no replica used zeros, not None
            assert p.grad is not None and not p.grad.any()
        else:
            torch.testing.assert_close(p.grad, q.grad)
    spans = {(p, d): nb for p, d, s, e, nb in log.spans}
    assert spans[("gather", 1)] == 16 * (10 + 16) * 4  # logits and hidden of device 1's half
    P = sum(p.numel() * 4 for p in model.parameters())
    assert spans[("reduce", 1)] == P  # the unused layer too
    assert log.copies[("gather", 1)] == 2 and log.copies[("reduce", 1)] == 1
    assert dp.sent[1] == 16 * (10 + 16) * 4 + P


@pytest.mark.parametrize("n", [1, 3])
def test_one_device_copies_nothing_and_three_split_the_batch(n):
    # by hand: 30 samples over 3 devices = 10 each; device j receives P (broadcast), its 10 rows
    # of 64 inputs and the logits' gradient (10 x 10); it sends logits and hidden (10 x 26) and P
    torch.manual_seed(0)
    model = _TwoHeads()
    P = sum(p.numel() * 4 for p in model.parameters())
    x, y = torch.randn(30, 64), torch.randint(0, 10, (30,))
    dp, log = _dp_step(model, x, y, n)
    if n == 1:
        assert dp.sent == dp.recv == [0] and log.copies.get(("broadcast", 0), 0) == 0
        return
    for j in (1, 2):
        assert dp.recv[j] == P + 10 * 64 * 4 + 10 * 10 * 4
        assert dp.sent[j] == 10 * 26 * 4 + P
    assert dp.sent[0] == dp.recv[1] + dp.recv[2] and dp.recv[0] == dp.sent[1] + dp.sent[2]
    assert log.copies[("broadcast", 0)] == 2 and log.copies[("gather", 0)] == 4
