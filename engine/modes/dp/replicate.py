"""DP's `replicate` on virtual CPU devices: new replica modules every step, as real DP builds them.

`torch.nn.DataParallel.forward` calls `torch.nn.parallel.replicate` on every forward
(torch/nn/parallel/replicate.py): each module is shallow-copied with
`Module._replicate_for_data_parallel()` (a new object, its own `_parameters` (empty), `_buffers`
and `_modules` dicts), the parameters and buffers are broadcast from device 0
(`comm.broadcast_coalesced`, which hands device 0 the source tensors themselves and every other
device a copy), and each replica's attributes are set to its device's tensors. Nothing is kept
between steps, so whatever a forward does to a replica (a rebound buffer, a drifted weight) is
gone at the next step.

Here the same structure, with CPU copies made as `comm.broadcast_coalesced` makes them (10 MiB flat
buffers, `engine.modes.dp.comm`) while the ledger attributes them to the receiving device. One
difference, named: real replicas hold non-leaf tensors (autograd's `Broadcast` sums their
gradients onto device 0 inside backward); here the copies are leaves that keep their own
`.grad`, and `EmulatedDP` reduces them onto device 0 in a timed phase of its own, so the reduce is
measured rather than hidden in backward.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn as nn

from ddpviz.engine.measure.ledger import TensorLedger
from ddpviz.engine.modes.dp.comm import Copy, broadcast_coalesced


@dataclass
class Replicas:
    """One step's replicas.

    Attributes:
        modules: replica j's top module (device j), new objects this step.
        params: params[j][k] is replica j's tensor of device 0's k-th parameter
            (`network.parameters()` order, a tied tensor once); params[0] are device 0's own.
        copies: each flat buffer copied from device 0 to a device (`engine.modes.dp.comm.Copy`:
            device, perf_counter start and end, bytes); device 0 keeps its tensors and gets none.
    """

    modules: list[nn.Module]
    params: list[list[torch.Tensor]]
    copies: list[Copy]

    def copied_bytes(self, device: int) -> int:
        """Bytes copied to `device` in this broadcast."""
        return sum(c.nbytes for c in self.copies if c.device == device)


def replicate_cpu(network: nn.Module, n: int, ledger: TensorLedger | None = None) -> Replicas:
    """Build `n` replicas of `network` (see the module docstring); replica 0 aliases device 0's
    parameters and buffers, replicas 1..n-1 own copies (parameters: leaves that require grad as
    device 0's do), broadcast in 10 MiB flat buffers (`engine.modes.dp.comm.broadcast_coalesced`):
    the parameters in one call, the buffers that require grad in a second and the others in a
    third, as `replicate` does."""
    params = list(network.parameters())
    param_copies, copies = broadcast_coalesced(params, n, ledger=ledger, kind="params",
                                               leaf=lambda k: params[k].requires_grad)
    buffers = list(network.buffers())
    buffer_copies: list[list[torch.Tensor]] = [[None] * len(buffers) for _ in range(n)]  # type: ignore[list-item]
    for group in ([k for k, b in enumerate(buffers) if b.requires_grad],
                  [k for k, b in enumerate(buffers) if not b.requires_grad]):
        out, made = broadcast_coalesced([buffers[k] for k in group], n, ledger=ledger, kind="buffers")
        copies += made
        for j in range(n):
            for k, t in zip(group, out[j]):
                buffer_copies[j][k] = t
    return Replicas(modules=_wire(network, n, params, param_copies, buffers, buffer_copies),
                    params=param_copies, copies=copies)


def _wire(network: nn.Module, n: int, params: list, param_copies: list, buffers: list,
          buffer_copies: list) -> list[nn.Module]:
    """New module objects per device, holding that device's tensors (replicate.py's loops)."""
    p_idx = {id(p): k for k, p in enumerate(params)}
    b_idx = {id(b): k for k, b in enumerate(buffers)}
    modules = list(network.modules())
    m_idx = {id(m): i for i, m in enumerate(modules)}
    module_copies: list[list[nn.Module]] = [[] for _ in range(n)]
    for m in modules:
        for j in range(n):
            replica = m._replicate_for_data_parallel()
            replica._former_parameters = OrderedDict()
            module_copies[j].append(replica)
    for i, m in enumerate(modules):
        for j in range(n):
            replica = module_copies[j][i]
            for key, child in m._modules.items():
                if child is None:
                    replica._modules[key] = None
                else:
                    setattr(replica, key, module_copies[j][m_idx[id(child)]])
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
    return [module_copies[j][0] for j in range(n)]
