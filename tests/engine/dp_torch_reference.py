"""torch.nn.parallel's own gradient reduce, run on CPU, as the reference for DP's byte counts.

`Broadcast.forward` and `comm.reduce_add` refuse CPU tensors; everything between them is torch's
own code and runs here unchanged: `Broadcast.backward` (inherited), `ReduceAddCoalesced`,
`comm.reduce_add_coalesced` (chunking by `_take_tensors`, flattening), and autograd, which
materialises the gradient of a broadcast copy that got none as zeros. Only two pieces are
replaced, each keeping its contract (torch/nn/parallel/_functions.py, comm.py):

- `CpuBroadcast(Broadcast).forward`: device 0 gets its own tensors, the others clones, device-major;
  the copies of inputs that need no grad are marked non-differentiable, as `Broadcast` does.
- `comm.reduce_add(inputs, destination)`: the sum, recording the bytes of every input that is not
  the destination's (what crosses to device 0), per call.

Shares no code with engine/modes/dp.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn as nn
from torch.func import functional_call
from torch.nn.parallel import _functions, comm


class CpuBroadcast(_functions.Broadcast):
    @staticmethod
    def forward(ctx, target_gpus, *inputs):
        ctx.target_gpus = list(target_gpus)
        ctx.num_inputs = len(inputs)
        ctx.input_device = -1  # CPU's get_device(): the destination of the reduce
        outs = [t if j == 0 else t.detach().clone() for j in range(len(target_gpus)) for t in inputs]
        frozen = [o for i, o in enumerate(outs) if not ctx.needs_input_grad[1 + i % len(inputs)]]
        ctx.mark_non_differentiable(*frozen)
        return tuple(outs)


@contextmanager
def recording_reduce_add(monkeypatch):
    """Within the block `comm.reduce_add` runs on CPU; yields the list of bytes it received from
    the non-destination input of each call (input 0 is the destination's)."""
    received: list[int] = []

    def reduce_add(inputs, destination=None):
        received.extend(t.numel() * t.element_size() for t in inputs[1:])
        out = inputs[0].clone()
        for t in inputs[1:]:
            out += t
        return out

    monkeypatch.setattr(comm, "reduce_add", reduce_add)
    yield received


def reduce_bytes_from_device_1(monkeypatch, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[int, int]:
    """Two replicas of `model` through torch's Broadcast backward; returns (bytes device 1 sent to
    device 0 in the gradient reduce, number of reduce_add calls = flat buffers)."""
    params = dict(model.named_parameters())
    names = list(params)
    with recording_reduce_add(monkeypatch) as received:
        copies = CpuBroadcast.apply([0, 1], *params.values())
        outs = []
        for j, xs in enumerate(x.chunk(2)):
            mine = dict(zip(names, copies[j * len(names):(j + 1) * len(names)]))
            outs.append(functional_call(model, mine, (xs,)))
        loss = nn.functional.cross_entropy(torch.cat(outs), y)
        loss.backward()
    return sum(received), len(received)
