"""torch.nn.parallel's CUDA-only copies, done on CPU, so engine/modes/dp/cuda.py runs in CI.

Only the copies are faked; `replicate`'s module wiring, autograd, the hooks and the thread
runner are the real ones. Each fake keeps the contract of the function it stands for
(torch/nn/parallel/_functions.py, comm.py):

- `CpuBroadcast` = `Broadcast`: outputs device-major (every input for device 0, then for device
  1, ...); device 0 gets its own tensors back (no copy), the others copies; the backward sums each
  input's gradients over devices (`ReduceAddCoalesced`).
- `broadcast_coalesced`: the same without autograd (replicate's path for buffers and detach=True).
- `scatter`: chunks of dim 0, device 0's a view, the others copies.
- `gather`: concatenation on device 0 (its backward hands each device its slice of the gradient).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.parallel._functions as functions
from torch.nn.parallel import comm

import ddpviz.engine.modes.dp.cuda as dp_cuda


class CpuBroadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, target_gpus, *inputs):
        ctx.n, ctx.k = len(target_gpus), len(inputs)
        outs = [t if j == 0 else t.clone() for j in range(ctx.n) for t in inputs]
        frozen = [o for i, o in enumerate(outs) if not ctx.needs_input_grad[1 + i % ctx.k]]
        ctx.mark_non_differentiable(*frozen)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        k = ctx.k
        return (None, *(sum(grads[j * k + i] for j in range(ctx.n)) for i in range(k)))


def broadcast_coalesced(tensors, devices, buffer_size=None):
    return [[t if j == 0 else t.clone() for t in tensors] for j in range(len(devices))]


def scatter(x, ids):
    return tuple(c if j == 0 else c.clone() for j, c in enumerate(x.chunk(len(ids))))


def gather(outs, target):
    return torch.cat(outs)


@contextlib.contextmanager
def cpu_parallel(monkeypatch):
    """Within the block, engine.modes.dp.cuda's torch.nn.parallel copies run on CPU."""
    monkeypatch.setattr(functions, "Broadcast", CpuBroadcast)
    monkeypatch.setattr(comm, "broadcast_coalesced", broadcast_coalesced)
    monkeypatch.setattr(dp_cuda, "scatter", scatter)
    monkeypatch.setattr(dp_cuda, "gather", gather)
    yield
