"""DP's `replicate` on virtual CPU devices: new replica modules every step, as real DP builds them.

`torch.nn.DataParallel.forward` calls `torch.nn.parallel.replicate` on every forward
(torch/nn/parallel/replicate.py): each module is shallow-copied with
`Module._replicate_for_data_parallel()` (a new object, its own `_parameters` (empty), `_buffers`
and `_modules` dicts), the parameters and buffers are broadcast from device 0
(`comm.broadcast_coalesced`, which hands device 0 the source tensors themselves and every other
device a copy), and each replica's attributes are set to its device's tensors. Nothing is kept
between steps, so whatever a forward does to a replica (a rebound buffer, a drifted weight) is
gone at the next step.

Here the same structure, with CPU copies made while the ledger attributes them to the receiving
device. One difference, named: real replicas hold non-leaf tensors (autograd's `Broadcast` sums
their gradients onto device 0 inside backward); here the copies are leaves that keep their own
`.grad`, and `EmulatedDP` reduces them onto device 0 in a timed phase of its own, so the reduce is
measured rather than hidden in backward.
"""

from __future__ import annotations

from collections import OrderedDict
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn as nn

from engine.measure.ledger import TensorLedger
from engine.measure.memory import tensor_bytes
from engine.measure.telemetry import now


@dataclass
class Replicas:
    """One step's replicas.

    Attributes:
        modules: replica j's top module (device j), new objects this step.
        params: params[j][k] is replica j's tensor of device 0's k-th parameter
            (`network.parameters()` order, a tied tensor once); params[0] are device 0's own.
        copied_bytes: bytes copied to each device (0 for device 0: it keeps its tensors).
        spans: (device, start, end) perf_counter seconds of each device's copy.
    """

    modules: list[nn.Module]
    params: list[list[torch.Tensor]]
    copied_bytes: list[int]
    spans: list[tuple[int, float, float]]


def _copies(tensors: list[torch.Tensor], n: int, ledger: TensorLedger | None, kind: str,
            leaf_grad: bool, spans: list, nbytes: list[int]) -> list[list[torch.Tensor]]:
    """Device 0 keeps `tensors`; devices 1..n-1 each get fresh copies (timed, counted)."""
    out = [list(tensors)]
    for j in range(1, n):
        t = now()
        with torch.no_grad(), (ledger.working_for(j, kind) if ledger else nullcontext()):
            copies = [x.detach().clone() for x in tensors]
        if leaf_grad:
            copies = [c.requires_grad_(x.requires_grad) for c, x in zip(copies, tensors)]
        spans.append((j, t, now()))
        nbytes[j] += tensor_bytes(copies)
        out.append(copies)
    return out


def replicate_cpu(network: nn.Module, n: int, ledger: TensorLedger | None = None) -> Replicas:
    """Build `n` replicas of `network` (see the module docstring); replica 0 aliases device 0's
    parameters and buffers, replicas 1..n-1 own copies (parameters: leaves that require grad)."""
    spans: list[tuple[int, float, float]] = []
    nbytes = [0] * n
    params = list(network.parameters())
    param_copies = _copies(params, n, ledger, "params", True, spans, nbytes)
    buffers = list(network.buffers())
    buffer_copies = _copies(buffers, n, ledger, "buffers", False, spans, nbytes)
    p_idx = {id(p): k for k, p in enumerate(params)}
    b_idx = {id(b): k for k, b in enumerate(buffers)}
    modules = list(network.modules())
    m_idx = {id(m): i for i, m in enumerate(modules)}
    copies: list[list[nn.Module]] = [[] for _ in range(n)]
    for m in modules:
        for j in range(n):
            replica = m._replicate_for_data_parallel()
            replica._former_parameters = OrderedDict()
            copies[j].append(replica)
    for i, m in enumerate(modules):
        for j in range(n):
            replica = copies[j][i]
            for key, child in m._modules.items():
                if child is None:
                    replica._modules[key] = None
                else:
                    setattr(replica, key, copies[j][m_idx[id(child)]])
            for key, p in m._parameters.items():
                if p is None:
                    replica._parameters[key] = None
                    continue
                # j = 0: a view, like Broadcast's output on the source device, so gradients land
                # in device 0's `.grad` and the replica still owns no Parameter
                t = p.view_as(p) if j == 0 else param_copies[j][p_idx[id(p)]]
                setattr(replica, key, t)
                replica._former_parameters[key] = t
            for key, b in m._buffers.items():
                replica._buffers[key] = None if b is None else buffer_copies[j][b_idx[id(b)]]
    return Replicas(modules=[copies[j][0] for j in range(n)], params=param_copies,
                    copied_bytes=nbytes, spans=spans)
