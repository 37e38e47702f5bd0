"""FSDP2 (`torch.distributed.fsdp.fully_shard`) modules the script builds, watched as they are built.

`patch_fsdp` wraps `FSDPState.init`, which `fully_shard` calls once per module it shards
(torch/distributed/fsdp/_fully_shard/_fully_shard.py), however the script imported
`fully_shard`. FSDP2 is imported by the script, not here (importing it costs seconds): the wrap
is put in place when `torch.distributed.fsdp`'s state module is first imported
(`engine.attach.imports.after_import`).

For each sharded module `FsdpWatch` adds a forward pre-hook, ahead of FSDP2's own (which
all-gathers the unit), and a forward hook after FSDP2's. The outermost sharded module whose
forward runs is the root: at its first forward the units are named as `mode=fsdp` names them
(qualified name in the root, the root ``root``, `engine.modes.fsdp.units`) and each gets the
recording all-gather and reduce-scatter of `mode=fsdp` (`engine.modes.fsdp.collectives.
install_recorders`: FSDP2's own default collectives plus a record, or, for a unit the script
gave its own all-gather or reduce-scatter, that object called unchanged inside a record; training
is unchanged). The
root's forward feeds the step tracker like a DDP's: forward time, the batch it sees, and whether
its backward reduce-scatters (`set_requires_gradient_sync(False)` micro-steps count as no-sync).

Per step (`comm_split`): on CPU the collectives block the training thread, so the union of their
spans in forward and in backward is exposed comm, taken out of `forward_s` and `backward_s`, as
`mode=fsdp` does. On the steps `engine.modes.fsdp.step.sample_step` picks (with the memory
sampler's `STEPS_HINT`: steps 0-2 and every 200th) every `fsdp_collective` and the step's
`comm_volume` are emitted (docs/events.md). On CUDA the spans are CUDA events on FSDP2's comm
stream, emitted once they completed (never a synchronize); the step's exposed comm is then not
measured (`comm_exposed_measured` false).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.distributed as dist

from ddpviz.engine.attach.memory import STEPS_HINT
from ddpviz.engine.attach.session import DeferredMarks, Session
from ddpviz.engine.attach.steps import compiled_away
from ddpviz.engine.measure.clocks import CudaClock, HostClock
from ddpviz.engine.measure.telemetry import wall_ts
from ddpviz.engine.modes.fsdp.collectives import CollectiveLog, exposed_comm_s, install_recorders, theory_bytes, volume_fields
from ddpviz.engine.modes.fsdp.step import sample_step
from ddpviz.engine.modes.fsdp.units import ROOT, layout_of

STATE_MODULE = "torch.distributed.fsdp._fully_shard._fsdp_state"  # private: where FSDPState lives (torch 2.13)


class FsdpWatch(DeferredMarks):
    """This process's FSDP2 modules (one watch, whatever the number of units); a watch of the step
    tracker (`engine.attach.steps`).

    Attributes:
        module: the root (known at its first forward; None before), device: the device FSDP2 shards on.
        units: [(name, module)] of the recorded units, root last (after the root's first forward).
    """

    reduces_gradients = True  # a backward reduce-scatters unless set_requires_gradient_sync(False)
    DEFERRED_PART = "fsdp collectives"

    def __init__(self, session: Session, tracker: Any, device: torch.device):
        self.s, self.tracker, self.device = session, tracker, device
        self.sharded: list[torch.nn.Module] = []  # every module fully_shard was given, in order
        self.module: torch.nn.Module | None = None
        self.units: list[tuple[str, torch.nn.Module]] = []
        self.log = CollectiveLog(CudaClock(device) if device.type == "cuda" else HostClock())
        self.log.phase = None
        self.log_step: int | None = None  # the step the log's records belong to
        self.deferred: list[tuple[int, list[dict], Any]] = []  # CUDA: sampled steps' records not yet complete
        self.theory: dict[str, int] | None = None
        session.set_device(device.type, device.index)

    def add(self, module: torch.nn.Module) -> None:
        """Watch a module `fully_shard` has just sharded."""
        self.sharded.append(module)
        module.register_forward_pre_hook(self._pre, prepend=True, with_kwargs=True)  # before FSDP2's all-gather
        module.register_forward_hook(self._post, always_call=True)

    @compiled_away
    def _pre(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        outermost = self.tracker.fwd_depth == 0
        if outermost and self.module is None:
            self.s.guard("fsdp collectives", self._take_root, module)
        state = _state(module)
        synced = bool(torch.is_grad_enabled() and all(g.reduce_grads for g in state._fsdp_param_groups))
        from ddpviz.engine.attach.steps import batch_samples

        self.s.guard("steps", self.tracker.forward_start, self, synced, batch_samples(args, kwargs))
        if outermost:
            if self.log_step != self.tracker.step:  # the step's first forward: its records start here
                self.log_step = self.tracker.step
                self.log.begin_step()
            self.log.phase = "forward" if torch.is_grad_enabled() else None  # evaluation is not recorded

    @compiled_away
    def _post(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        self.s.guard("steps", self.tracker.forward_end)

    def _take_root(self, root: torch.nn.Module) -> None:
        """Name the units under `root` and give each the recording collectives (see the module docstring)."""
        self.module = root
        names = {id(m): n for n, m in root.named_modules()}
        inner = [(names[id(m)], m) for m in self.sharded if m is not root and id(m) in names]
        units = inner + [(ROOT, root)]
        # several parameter groups (a per-parameter mesh, shard_placement_fn): FSDP2 takes no custom comm there
        custom = [n for n, m in units if len(_state(m)._fsdp_param_groups) > 1]
        if custom:
            self.s.note(f"rank {self.s.rank}: FSDP units {custom} have several parameter groups (FSDP2 takes "
                        f"no custom collectives there); theirs are not recorded")
        self.units = [(n, m) for n, m in units if n not in custom and _state(m)._fsdp_param_groups]
        why = install_recorders(self.units, self.log)
        if why:
            self.s.note(f"rank {self.s.rank}: {why}")
        world = dist.get_world_size()
        numel = sum(p.numel() for p in root.parameters() if p.requires_grad)  # a DTensor's numel is the full size
        gather, reduce = _dtype_bytes(root)
        self.theory = theory_bytes(world, numel, reshard_after_forward=self._reshards(),
                                   gather_dtype_bytes=gather, reduce_dtype_bytes=reduce)

    def _reshards(self) -> bool:
        return any(g.post_forward_mesh_info is not None for n, m in self.units if n != ROOT
                   for g in _state(m)._fsdp_param_groups)

    def begin_backward(self, synced: bool) -> None:
        self.log.phase = "backward"

    def comm_split(self, step: int, micros: list[dict]) -> tuple[float, float, dict[str, Any]]:
        """(exposed comm in forward, in backward, extra step fields) of `step` (module docstring)."""
        extra: dict[str, Any] = dict(backward_start_ts=wall_ts(micros[-1]["t0"]))
        self.log.phase = None
        if not self.log.recording or not self.units or "fsdp collectives" in self.s.disabled \
                or self.log_step != step:
            return 0.0, 0.0, extra
        return self.s.guard("fsdp collectives", self._split, step, extra) or (0.0, 0.0, extra)

    def _split(self, step: int, extra: dict[str, Any]) -> tuple[float, float, dict[str, Any]]:
        sampled = sample_step(step, STEPS_HINT)
        if isinstance(self.log.clock, HostClock):
            records = self.log.resolved()
            if sampled:
                self._emit(step, records)
            extra["comm_exposed_measured"] = True
            return exposed_comm_s(records, "forward"), exposed_comm_s(records, "backward"), extra
        if sampled:
            self.deferred.append((step, self.log.records, self.log.origin))
        self._emit_completed()
        extra["comm_exposed_measured"] = False
        return 0.0, 0.0, extra

    def _emit_completed(self) -> None:
        while self.deferred and _completed(self.deferred[0]):
            st, records, origin = self.deferred.pop(0)
            self._emit(st, _resolved(self.log, records, origin))

    def _item_marks(self, item: tuple[int, list[dict], Any]) -> list[Any]:
        return _marks(item)

    def _emit(self, step: int, records: list[dict[str, Any]]) -> None:
        clock = "host" if isinstance(self.log.clock, HostClock) else "cuda"
        for r in records:
            self.s.emit("fsdp_collective", step=step, clock=clock, **r)
        formula = "3(n−1)/n·P" if self._reshards() else "2(n−1)/n·P"
        self.s.emit("comm_volume", step=step, **volume_fields(records, dist.get_backend(), dist.get_world_size(),
                                                               self.theory, formula))

    def started_fields(self) -> dict[str, Any]:
        """`run_started`'s `mode` and `fsdp_units` (as `engine.modes.fsdp.units.fsdp_preview`)."""
        root = self.module
        if root is None:
            return dict(mode="fsdp")
        gather, reduce = _dtype_bytes(root)
        units = layout_of(root, [u for u in self.units if u[0] != ROOT], dist.get_world_size(), gather, reduce)
        return dict(mode="fsdp", fsdp_units=dict(
            units=units, note=None, reshard_after_forward=self._reshards(),
            param_dtype=_dtype_name(gather), reduce_dtype=_dtype_name(reduce),
            source="measured: the modules the script gave fully_shard, named in its root"))


def _state(module: torch.nn.Module) -> Any:
    return module._get_fsdp_state()


def _dtype_bytes(root: torch.nn.Module) -> tuple[int, int]:
    """Bytes per element of the all-gathered parameters and of the reduce-scattered gradients
    (the root's `MixedPrecisionPolicy`; unset: the parameters' own dtype)."""
    p = next(root.parameters())
    mp = _state(root)._mp_policy
    param = mp.param_dtype or p.dtype
    return param.itemsize, (mp.reduce_dtype or param).itemsize


def _dtype_name(nbytes: int) -> str:
    return {4: "float32", 2: "bfloat16"}.get(nbytes, f"{nbytes} bytes")


def _marks(item: tuple[int, list[dict], Any]) -> list[Any]:
    _, records, origin = item
    return [origin] + [r[k] for r in records for k in ("start", "end") if k in r]


def _completed(item: tuple[int, list[dict], Any]) -> bool:
    return all(m.query() for m in _marks(item)) and all("end" in r for r in item[1])


def _resolved(log: CollectiveLog, records: list[dict], origin: Any) -> list[dict[str, Any]]:
    saved = log.records, log.origin
    log.records, log.origin = records, origin
    try:
        return log.resolved()
    finally:
        log.records, log.origin = saved


def patch_fsdp(session: Session, tracker: Any) -> None:
    """Wrap `FSDPState.init` now, or when the script first imports FSDP2 (module docstring)."""
    from ddpviz.engine.attach.imports import after_import

    def patch(mod: Any) -> None:
        state_cls = mod.FSDPState
        init = state_cls.init

        @functools.wraps(init)
        def wrapped_init(self, modules, device, *args, **kwargs):
            init(self, modules, device, *args, **kwargs)
            session.guard("fsdp", _watch, session, tracker, modules, device)

        state_cls.init = wrapped_init

    after_import(STATE_MODULE, lambda mod: session.guard("fsdp", patch, mod))


def _watch(session: Session, tracker: Any, modules: tuple, device: torch.device) -> None:
    watch = next((w for w in tracker.watches if isinstance(w, FsdpWatch)), None)
    if watch is None:
        watch = FsdpWatch(session, tracker, torch.device(device))
        tracker.watches.append(watch)
    for m in modules:
        watch.add(m)
