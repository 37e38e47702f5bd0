"""What an FSDP rank holds: the measured peak (the ledger) and the within-step curve by kind.

The peak — `fsdp_memory_sampler` — is measured as DDP's is: on traced steps
(`engine.measure.memory_sampler.should_trace_memory`) the live-tensor ledger sees every storage
the rank creates over the whole step, forward, backward and `opt.step` (AdamW's temporaries
too), plus the gathered parameters FSDP2 allocates and frees by resizing storage in place
(`resize_hooks`); the `memory` event carries its exact maximum.

The curve by kind — `FsdpMemoryProbe`, on the same traced steps — samples at FSDP's hooks
(collective start/end, after each unit's pre-forward, forward/backward/optimizer ends) the bytes
this rank holds then, by kind, each summed over the storages of tensors that really exist
(deduplicated by storage, so a tied or viewed tensor counts once), plus the process's RSS:

- `sharded_params`: the local shards of the parameters (DTensor local storages, padded);
- `unsharded_params`: storages of parameters a unit has all-gathered and not yet resharded (FSDP2
  registers the unsharded tensor on the module while a unit is unsharded and the DTensor shard
  otherwise, `FSDPParam.to_unsharded` / `to_sharded`);
- `sharded_grads`, `unsharded_grads`: gradients of those two;
- `optimizer_state`: tensors in the optimizer's state (their local shards);
- `comm_buffers`: the flat all-gather outputs and reduce-scatter inputs FSDP2 handed to the
  recording collectives and still holds;
- `activations`: tensors autograd saved for backward that are still alive;
- `buffers`: module buffers.

It shows what each unit's gathered parameters add and when; it is a sample at those points, so
its highest point can miss what lives between them (backward's and the optimizer's temporaries):
the peak is the ledger's.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn

from ddpviz.engine.config import RunConfig
from ddpviz.engine.measure.ledger import TensorLedger
from ddpviz.engine.measure.memory import optimizer_state_tensors
from ddpviz.engine.measure.memory_sampler import DeviceProbe, MemorySampler, phase_hooks
from ddpviz.engine.measure.telemetry import Telemetry, now

CURVE_SOURCE = "tensors alive at FSDP's hooks (storages on this rank) + process RSS (psutil)"
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


def fsdp_params(units: list[tuple[str, nn.Module]]) -> list[Any]:
    """FSDP2's `FSDPParam` of every unit (private: `FSDPModule._get_fsdp_state()._fsdp_param_group`,
    torch 2.13's layout); [] where this torch lays it out otherwise."""
    out = []
    for _, mod in units:
        try:
            group = mod._get_fsdp_state()._fsdp_param_group
        except AttributeError:
            return []
        out += list(group.fsdp_params) if group is not None else []
    return out


@contextlib.contextmanager
def resize_hooks(ledger: TensorLedger, params: list[Any]) -> Iterator[None]:
    """While a traced step runs, tell `ledger` of each storage FSDP2 re-allocates or frees by
    resizing it in place (`FSDPParam.alloc_all_gather_outputs`, `free_unsharded_param`), which
    no aten op shows; filed as "unsharded_params". Removed after the step."""
    for fp in params:
        def alloc(fp=fp, inner=fp.alloc_all_gather_outputs):
            inner()
            ledger.resized(fp.all_gather_outputs, "unsharded_params")

        def free(fp=fp, inner=fp.free_unsharded_param):
            inner()
            ledger.resized([*fp.all_gather_outputs, *getattr(fp, "_unsharded_inner_tensors", [])],
                           "unsharded_params")
        fp.alloc_all_gather_outputs, fp.free_unsharded_param = alloc, free
    try:
        yield
    finally:
        for fp in params:
            del fp.alloc_all_gather_outputs, fp.free_unsharded_param  # back to the class's methods


def fsdp_memory_sampler(cfg: RunConfig, tel: Telemetry, model: nn.Module, opt: torch.optim.Optimizer,
                        device: torch.device, units: list[tuple[str, nn.Module]],
                        phases_of: Callable[[int], list[tuple[str, float, float]]]) -> MemorySampler:
    """The memory sampler of one FSDP rank, DDP's (`engine.measure.memory_sampler`): the timer, and on
    traced steps the live-tensor ledger over the whole step — forward, backward, `opt.step` — so
    the `memory` event's peak is the exact maximum of the bytes of the storages this rank holds.

    At a traced step's start the ledger counts the local shards of the parameters, their gradients,
    the optimizer state, buffers and any gathered parameters still held; during it every op's
    outputs (DTensors by their local shard) and the gathered parameters FSDP2 resizes in place
    (`resize_hooks`). `phases_of(0)` gives the step's measured forward, backward and optimizer
    spans (perf_counter s).
    """
    ledger = TensorLedger(1, device_type=device.type)
    params = fsdp_params(units)

    def existing():
        return [(0, "params", model.parameters()), (0, "buffers", model.buffers()),
                (0, "grads", [p.grad for p in model.parameters()]),
                (0, "optimizer_state", optimizer_state_tensors(opt)),
                (0, "unsharded_params", [t for fp in params for t in fp.all_gather_outputs])]

    @contextlib.contextmanager
    def hooks():
        with phase_hooks(ledger, model, opt), resize_hooks(ledger, params):
            yield

    probe = DeviceProbe(tel.device, ledger_index=0,
                        cuda_index=(device.index or 0) if device.type == "cuda" else None)
    return MemorySampler(tel, [probe], cfg.steps, ledger=ledger, existing=existing, hooks=hooks,
                         phases_of=phases_of)
