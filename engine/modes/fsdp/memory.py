"""What an FSDP rank holds, read from tensors that exist at the moment of a sample.

`fsdp_memory_sample(probe)` is the one entry point: it returns the bytes this rank holds right
now, by kind, each summed over the storages of tensors that really exist (deduplicated by
storage, so a tied or viewed tensor counts once), plus the process's resident memory (psutil):

- `sharded_params`: the local shards of the parameters (DTensor local storages, padded);
- `unsharded_params`: storages of parameters a unit has all-gathered and not yet resharded (FSDP2
  registers the unsharded tensor on the module while a unit is unsharded and the DTensor shard
  otherwise, `FSDPParam.to_unsharded` / `to_sharded`);
- `sharded_grads`, `unsharded_grads`: gradients of those two;
- `optimizer_state`: tensors in the optimizer's state (their local shards);
- `comm_buffers`: the flat all-gather outputs and reduce-scatter inputs FSDP2 handed to the
  recording collectives and still holds;
- `activations`: tensors autograd saved for backward that are still alive (on sampled steps);
- `buffers`: module buffers.

`FsdpMemoryProbe.curve` samples at points inside a step (collective start/end, after each unit's
pre-forward, forward/backward/optimizer ends), so the within-step curve shows each unit's
transient unsharded parameters. When a timer-based sampler exists, it can call
`fsdp_memory_sample` from its thread (reads only).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn as nn

from engine.measure.telemetry import now

SOURCE = "tensors (storages alive on this rank) + process RSS (psutil)"
KINDS = ("sharded_params", "unsharded_params", "sharded_grads", "unsharded_grads", "optimizer_state",
         "comm_buffers", "activations", "buffers")


def _local(t: torch.Tensor) -> torch.Tensor:
    # A DTensor's local shard. `to_local()` is an autograd op (tens of µs); reading the
    # attribute that holds the same tensor is not, and a sample reads dozens of them.
    return getattr(t, "_local_tensor", t)


def storage_bytes(tensors, seen: set[int]) -> int:
    """Bytes of the distinct storages behind `tensors` (DTensors: their local shard); adds to `seen`."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        s = _local(t).untyped_storage()
        key = s.data_ptr()
        if key in seen or s.nbytes() == 0:
            continue
        seen.add(key)
        total += s.nbytes()
    return total


class LiveActivations:
    """Tensors saved for backward (`saved_tensors_hooks`) with weak references, so a sample can
    count the ones still alive. Parameters (leaves requiring grad) are not activations."""

    def __init__(self) -> None:
        self.refs: list[weakref.ref] = []

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if not (t.is_leaf and t.requires_grad):
            self.refs.append(weakref.ref(t))
        return t

    def hooks(self):
        self.refs = []
        return torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def alive(self) -> list[torch.Tensor]:
        return [t for t in (r() for r in self.refs) if t is not None]


class FsdpMemoryProbe:
    """Reads an FSDP rank's memory by kind; keeps the within-step curve of a sampled step.

    Args:
        model: the root FSDP module (after every `fully_shard`).
        opt: its optimizer.
        device: the rank's device (CUDA adds `torch.cuda.memory_allocated` to each point).
    """

    def __init__(self, model: nn.Module, opt: torch.optim.Optimizer, device: torch.device):
        import psutil

        self.model, self.opt, self.device = model, opt, device
        self.sharded = list(model.parameters())  # the DTensor shards, fixed for the run
        self.slots = [(m, name) for m in model.modules() for name, _ in m.named_parameters(recurse=False)]
        self.comm: list[weakref.ref] = []
        self.acts = LiveActivations()
        self.process = psutil.Process()
        self.active = False
        self.origin = 0.0
        self.points: list[dict[str, Any]] = []

    def begin(self) -> None:
        """Start a sampled step's curve (times from now)."""
        self.active, self.origin, self.points, self.comm = True, now(), [], []
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def note_comm_buffer(self, t: torch.Tensor) -> None:
        if self.active:
            self.comm.append(weakref.ref(t))

    def point(self, label: str, phase: str) -> None:
        """Add a sample to the curve (only while a sampled step is active)."""
        if self.active:
            self.points.append(dict(t_s=now() - self.origin, label=label, phase=phase,
                                    **fsdp_memory_sample(self)))

    def end(self) -> list[dict[str, Any]]:
        """The curve of the step that `begin` started (empty when none was started)."""
        points = self.points if self.active else []
        self.active, self.points = False, []
        return points


def _unsharded(probe: FsdpMemoryProbe) -> list[torch.Tensor]:
    from torch.distributed.tensor import DTensor

    current = (getattr(m, name) for m, name in probe.slots)
    return [p for p in current if not isinstance(p, DTensor)]


def fsdp_memory_sample(probe: FsdpMemoryProbe) -> dict[str, Any]:
    """Bytes this rank holds now, by kind (see module docstring), their sum and the process RSS.

    Returns:
        {kind: bytes for kind in KINDS, "tensor_bytes": sum, "rss_bytes": psutil RSS,
         "cuda_allocated_bytes": torch.cuda.memory_allocated (CUDA only)}.
    """
    seen: set[int] = set()
    unsharded = _unsharded(probe)
    out = dict(
        sharded_params=storage_bytes(probe.sharded, seen),
        unsharded_params=storage_bytes(unsharded, seen),
        sharded_grads=storage_bytes((p.grad for p in probe.sharded), seen),
        unsharded_grads=storage_bytes((p.grad for p in unsharded), seen),
        optimizer_state=storage_bytes((v for st in probe.opt.state.values() for v in st.values()
                                       if torch.is_tensor(v)), seen),
        comm_buffers=storage_bytes((r() for r in probe.comm), seen),
        activations=storage_bytes(probe.acts.alive(), seen),
        buffers=storage_bytes(probe.model.buffers(), seen),
    )
    out["tensor_bytes"] = sum(out.values())
    out["rss_bytes"] = int(probe.process.memory_info().rss)
    if probe.device.type == "cuda":
        out["cuda_allocated_bytes"] = int(torch.cuda.memory_allocated(probe.device))
    return out


def memory_fields(points: list[dict[str, Any]], device: torch.device) -> dict[str, Any]:
    """The `memory` event of a sampled step from its curve: the peak point.

    `breakdown` is the peak point's bytes by kind and `allocated_bytes` their sum (as for
    `engine.measure.memory.accounted_event`, allocated = the breakdown's total), which is also
    `peak_allocated_bytes`, the largest tensor total among the points (CUDA: the allocator's
    figures, `max_memory_allocated` since the step began). `end_of_step_bytes`: the last point's
    total, what the rank keeps between steps (its shards and optimizer state).
    """
    peak = max(points, key=lambda p: p["tensor_bytes"])
    last = points[-1]
    fields = dict(allocated_bytes=peak["tensor_bytes"], reserved_bytes=None, used_bytes=None,
                  source=SOURCE, breakdown={k: int(peak[k]) for k in KINDS},
                  peak_allocated_bytes=peak["tensor_bytes"], peak_label=peak["label"],
                  end_of_step_bytes=last["tensor_bytes"], rss_bytes=last["rss_bytes"],
                  peak_rss_bytes=max(p["rss_bytes"] for p in points))
    if device.type == "cuda":
        fields.update(allocated_bytes=int(torch.cuda.memory_allocated(device)),
                      reserved_bytes=int(torch.cuda.memory_reserved(device)),
                      peak_allocated_bytes=int(torch.cuda.max_memory_allocated(device)),
                      source="cuda allocator (torch.cuda); breakdown from tensors")
    return fields
