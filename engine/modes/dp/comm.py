"""DP's copies on virtual CPU devices, made the way torch.nn.parallel makes them on GPUs.

torch/nn/parallel/comm.py (and torch/csrc/cuda/comm.cpp, which it calls) never copies a model
tensor by tensor:

- `broadcast_coalesced(tensors, devices, buffer_size=10 MiB)` (what `replicate` and
  `Broadcast` call for the parameters, and again for the buffers): `_take_tensors` splits the
  tensors into chunks of one dtype of at most `buffer_size` bytes (a tensor larger than that is a
  chunk of its own); each chunk is flattened into one buffer on device 0
  (`_flatten_dense_tensors`), that buffer is copied once to every other device, and each device
  views its copy as the chunk's tensors (`_unflatten_dense_tensors`). Device 0 keeps its own
  tensors.
- `reduce_add_coalesced(inputs, destination, buffer_size=10 MiB)` (what `ReduceAddCoalesced`,
  the backward of `Broadcast`, calls for the gradients): the same chunks, each flattened on its
  device, copied to the destination and summed there. Autograd hands it a gradient for every
  broadcast parameter: one that got none (frozen, or unused in forward) arrives as zeros of its
  size (`Function` materialises undefined gradients), so every parameter crosses the link.
- `gather(outputs, target_device)` (scatter_gather.py, `gather_map`): every tensor of the
  output structure (tensor, dict, namedtuple, list or tuple, nested; None stays None) is
  concatenated on the target device along dim 0, a 0-dim tensor as a 1-element vector.

Here the same chunks, flats and copies on CPU tensors, with every copy that crosses between two
virtual devices timed and counted (`Copy`). The functions are torch's own
(`torch._utils._take_tensors`, `_flatten_dense_tensors`, `_unflatten_dense_tensors`); only the
copy between devices is a `clone` where CUDA would copy over PCIe or NVLink.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, NamedTuple, Sequence

import torch
from torch._utils import _flatten_dense_tensors, _take_tensors, _unflatten_dense_tensors

from ddpviz.engine.measure.ledger import TensorLedger
from ddpviz.engine.measure.telemetry import now

BUFFER_SIZE_BYTES = 10 * 1024 * 1024  # comm.broadcast_coalesced / reduce_add_coalesced default, 10 MiB


class Copy(NamedTuple):
    """One buffer that crossed between device 0 and `device`: perf_counter seconds, bytes."""

    device: int
    start: float
    end: float
    nbytes: int


def coalesced_chunks(tensors: Sequence[torch.Tensor], buffer_size: int = BUFFER_SIZE_BYTES) -> list[list[int]]:
    """Indices into `tensors` of each chunk `_take_tensors(tensors, buffer_size)` yields (one dtype
    per chunk, at most `buffer_size` bytes unless one tensor alone is larger).

    Raises:
        ValueError: a sparse tensor (DP's CPU emulation copies dense tensors only).
    """
    index = {id(t): k for k, t in enumerate(tensors)}
    if len(index) != len(tensors):
        raise ValueError("coalesced copies need distinct tensor objects (a tensor appears twice)")
    for t in tensors:
        if t.is_sparse:
            raise ValueError("DP's CPU emulation copies dense tensors only (got a sparse tensor)")
    return [[index[id(t)] for t in chunk] for chunk in _take_tensors(list(tensors), buffer_size)]


def _on(ledger: TensorLedger | None, device: int, kind: str):
    return ledger.working_for(device, kind) if ledger is not None and ledger.active else nullcontext()


def broadcast_coalesced(tensors: Sequence[torch.Tensor], n: int, *, ledger: TensorLedger | None = None,
                        kind: str = "params", buffer_size: int = BUFFER_SIZE_BYTES,
                        leaf: Callable[[int], bool] = lambda k: False,
                        ) -> tuple[list[list[torch.Tensor]], list[Copy]]:
    """`comm.broadcast_coalesced(tensors, range(n), buffer_size)` on virtual CPU devices.

    Args:
        tensors: device 0's tensors (dense), each object once.
        n: devices; device 0 is the source.
        ledger: attributes device 0's flat buffers and each device's copy (as `kind`).
        leaf: leaf(k) True makes device j's view of tensors[k] a leaf that requires grad (DP's
            replica parameters; see `engine.modes.dp.replicate` for why leaves).

    Returns:
        (out, copies): out[j][k] is device j's tensors[k] (out[0] are `tensors` themselves; for
        j ≥ 1 views of that device's copy of the chunk's flat buffer); one `Copy` per chunk and
        device 1..n-1, in chunk order.
    """
    out: list[list[Any]] = [list(tensors)] + [[None] * len(tensors) for _ in range(1, n)]
    copies: list[Copy] = []
    if n == 1 or not tensors:
        return out, copies
    with torch.no_grad():
        for chunk in coalesced_chunks(tensors, buffer_size):
            parts = [tensors[k].detach() for k in chunk]
            with _on(ledger, 0, kind):
                flat = _flatten_dense_tensors(parts)  # device 0 packs the chunk once
            for j in range(1, n):
                t = now()
                with _on(ledger, j, kind):
                    arrived = flat.clone()  # the one copy per chunk that crosses to device j
                views = _unflatten_dense_tensors(arrived, parts)
                copies.append(Copy(j, t, now(), arrived.numel() * arrived.element_size()))
                for k, v in zip(chunk, views):
                    out[j][k] = v.detach().requires_grad_(True) if leaf(k) else v
    return out, copies


def reduce_add_coalesced(grads: Sequence[Sequence[torch.Tensor | None]], like: Sequence[torch.Tensor], *,
                         ledger: TensorLedger | None = None, buffer_size: int = BUFFER_SIZE_BYTES,
                         ) -> tuple[list[torch.Tensor], list[Copy]]:
    """What `ReduceAddCoalesced` moves to device 0: the sum of devices 1..n-1's gradients.

    Args:
        grads: grads[j-1][k] is device j's gradient of `like[k]` (j = 1..n-1), None where autograd
            gave none: reduced as zeros of `like[k]`'s size, as autograd materialises it.
        like: device 0's tensors (sizes, dtypes and the chunking come from them).

    Returns:
        (sums, copies): sums[k] is Σ_j grads[j][k] on device 0 (zeros where every device had
        none); one `Copy` per chunk and device, the chunk flattened on its device and copied to
        device 0 (`ledger` kind `grad_copies`).

    Device 0's own gradients are not in `sums`: in the emulation they reach device 0's `.grad`
    through autograd already (`engine.modes.dp.replicate`), where torch flattens them too and
    adds the copies to them; the bytes that cross and the number of copies are the same.
    """
    sums: list[Any] = [None] * len(like)
    copies: list[Copy] = []
    with torch.no_grad():
        for chunk in coalesced_chunks(like, buffer_size):
            acc = None
            for j, dev_grads in enumerate(grads, start=1):
                t = now()
                with _on(ledger, j, "grads"):
                    parts = [torch.zeros_like(like[k]) if dev_grads[k] is None else dev_grads[k] for k in chunk]
                    flat = _flatten_dense_tensors(parts)
                with _on(ledger, 0, "grad_copies"):
                    arrived = flat.clone()  # crosses to device 0
                    acc = arrived if acc is None else acc.add_(arrived)
                copies.append(Copy(j, t, now(), arrived.numel() * arrived.element_size()))
            if acc is None:
                continue
            for k, v in zip(chunk, _unflatten_dense_tensors(acc, [like[k] for k in chunk])):
                sums[k] = v
    return sums, copies


class Gathered(NamedTuple):
    """`gather_outputs`' result: the structure on device 0, its leaves, and the copies made.

    `leaves[i]` = (gathered tensor (requires grad when a replica's did), each device's own output
    tensor (with its graph), rows per device, whether the outputs were 0-dim).
    """

    output: Any
    leaves: list[tuple[torch.Tensor, list[torch.Tensor], list[int], bool]]
    copies: list[Copy]


def gather_outputs(outputs: Sequence[Any], *, ledger: TensorLedger | None = None) -> Gathered:
    """`scatter_gather.gather(outputs, 0)` on virtual CPU devices, every tensor of the structure.

    Each tensor leaf is concatenated on device 0 along dim 0 (a 0-dim tensor as a vector of one
    element per device, as `Gather` does), detached from the replicas' graphs and made to require
    grad, so the loss's backward stops at it and each replica's backward runs in its own thread.

    Raises:
        ValueError: dicts with different numbers of keys (torch's message).
        TypeError: a leaf that is neither a tensor, None, dict nor sequence (torch fails there too).
    """
    leaves: list = []
    copies: list[Copy] = []

    def one(originals: Sequence[torch.Tensor]) -> torch.Tensor:
        scalar = all(p.dim() == 0 for p in originals)
        parts = [p.detach().reshape(1) if scalar else p.detach() for p in originals]
        rows = [p.shape[0] for p in parts]
        with _on(ledger, 0, "gathered_outputs"):
            into = torch.empty((sum(rows),) + tuple(parts[0].shape[1:]), dtype=parts[0].dtype)
            start = 0
            for i, p in enumerate(parts):
                t = now()
                into[start:start + rows[i]].copy_(p)
                start += rows[i]
                if i > 0:
                    copies.append(Copy(i, t, now(), p.numel() * p.element_size()))
        into.requires_grad_(any(p.requires_grad for p in originals))
        leaves.append((into, list(originals), rows, scalar))
        return into

    def gather_map(outs: Sequence[Any]) -> Any:  # torch.nn.parallel.scatter_gather.gather's walk
        out = outs[0]
        if isinstance(out, torch.Tensor):
            return one(outs)
        if out is None:
            return None
        if isinstance(out, dict):
            if not all(len(out) == len(d) for d in outs):
                raise ValueError("All dicts must have the same number of keys")
            return type(out)((k, gather_map([d[k] for d in outs])) for k in out)
        if isinstance(out, tuple) and hasattr(out, "_fields"):
            return type(out)._make(map(gather_map, zip(*outs, strict=True)))
        return type(out)(map(gather_map, zip(*outs, strict=True)))

    return Gathered(gather_map(list(outputs)), leaves, copies)


def tensor_leaves(output: Any) -> list[torch.Tensor]:
    """The tensors `gather` would move from one replica's `output` (dict values, sequence items,
    nested), in its walk's order."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        return [t for v in output.values() for t in tensor_leaves(v)]
    if isinstance(output, (list, tuple)):
        return [t for v in output for t in tensor_leaves(v)]
    return []


def grads_for_replicas(g: Gathered, n: int) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """Per device: (its output tensors that received a gradient, those gradients), the gathered
    gradients split back by rows (`Gather.backward` = `Scatter`); leaves the loss never reached
    get none, as in torch."""
    per = [([], []) for _ in range(n)]
    for into, parts, rows, scalar in g.leaves:
        if into.grad is None:
            continue
        for i, piece in enumerate(into.grad.split(rows)):
            per[i][0].append(parts[i])
            per[i][1].append(piece.reshape(()) if scalar else piece)
    return per
