"""FSDP2's collectives, recorded where FSDP2 itself lets us: its custom-comm hooks.

`FSDPModule.set_custom_all_gather` / `set_custom_reduce_scatter` (torch/distributed/fsdp/
_fully_shard/_fully_shard.py) let a caller replace the object that runs each unit's all-gather
and reduce-scatter. ddpviz installs `RecordingAllGather` / `RecordingReduceScatter`, subclasses
of the defaults FSDP2 uses (`DefaultAllGather`, `DefaultReduceScatter` in _fsdp_collectives.py),
which run exactly the default collective and note, per call: the unit, the kind, the phase
(forward or backward, set by the training loop), the bytes of the tensors FSDP2 handed over
(measured: numel x element size of the real output/input), and clock marks around the call.

Clocks: on CPU, gloo collectives issued with ``async_op=False`` run to completion inside the
call, on the training thread, so the host clock around it is the collective's span on this rank
(including any wait for a slower peer). On CUDA the call only enqueues work on FSDP2's comm
stream; CUDA events recorded on that stream (the current stream inside the call) time it.

Bytes on the wire per rank are derived from the measured tensor sizes: a ring all-gather sends
and receives (n-1)/n of its output; NCCL's ring reduce-scatter (n-1)/n of its input; gloo's
reduce_scatter_tensor is a clone plus an all-reduce of the whole input (ProcessGroupGloo.cpp,
``reduce_scatter_tensor_coalesced``; ddpviz measured 2.0x an all-gather's loopback bytes), so
2(n-1)/n on gloo. Theory (ZeRO-3, Rajbhandari et al. 2020): 3(n-1)/n * P per rank and step with
reshard_after_forward (all-gather in forward and in backward, reduce-scatter), 2(n-1)/n * P
without; DDP's ring all-reduce 2(n-1)/n * P.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ddpviz.engine.measure.clocks import HostClock
from ddpviz.engine.summary import interval_union_s

SOURCE_HOST = "fsdp2 set_custom_all_gather/set_custom_reduce_scatter; host clock around the blocking call"
SOURCE_CUDA = "fsdp2 set_custom_all_gather/set_custom_reduce_scatter; CUDA events on FSDP's comm stream"
VOLUME_SOURCE = ("derived (collective bytes x wire factor): measured tensor bytes of every all-gather and reduce-scatter x the "
                 "backend's wire factor per rank (ring all-gather (n-1)/n; reduce-scatter (n-1)/n "
                 "on NCCL, 2(n-1)/n on gloo, which runs it as an all-reduce)")


def wire_factor(kind: str, backend: str | None, world_size: int) -> float:
    """Bytes each rank sends (= receives) per byte of a collective's full-size tensor."""
    n = world_size
    if n <= 1:
        return 0.0
    if kind == "reduce_scatter" and backend == "gloo":
        return 2 * (n - 1) / n  # gloo: clone + all-reduce of the full input
    return (n - 1) / n


PRIVATE_COLLECTIVES = "torch.distributed.fsdp._fully_shard._fsdp_collectives"  # private: may move


def _gather_types():
    # The defaults FSDP2 installs on every param group; subclassing keeps their allocation.
    # Private classes (torch 2.13's layout): `install_recorders` says so if this torch lacks them.
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

    return DefaultAllGather, DefaultReduceScatter


class CollectiveLog:
    """This rank's FSDP collectives in the current step.

    Args:
        clock: `HostClock()` on CPU, `engine.measure.clocks.CudaClock()` on CUDA.

    The training loop calls `begin_step()` before forward, sets `phase` to "backward" before
    backward and to None after it; calls made with phase None (evaluation, the final gather) are
    not recorded.
    """

    def __init__(self, clock=None):
        self.clock = clock or HostClock()
        self.recording = True  # False when this torch's FSDP2 cannot be recorded (`install_recorders`)
        self.phase: str | None = None
        self.origin: Any = None
        self.records: list[dict[str, Any]] = []
        # Optional listeners (the memory probe): called outside the timed span.
        self.on_open: Callable[[dict, torch.Tensor], None] | None = None
        self.on_close: Callable[[dict], None] | None = None

    def begin_step(self, origin: Any = None) -> None:
        """Start a step's records. `origin`: the step's own start mark (a mark of the same kind as this log's
        clock), so the collectives' `start_s` and the step's `phase_spans` share one origin; else a mark now.
        Two readings were apart by a preemption once (a 2-core VM under load): spans showed up to 4.5 ms early."""
        self.records = []
        self.origin = self.clock.mark() if origin is None else origin
        self.phase = "forward"

    def open(self, unit: str, kind: str, full: torch.Tensor, shard: torch.Tensor) -> dict | None:
        if self.phase is None:
            return None
        rec = dict(unit=unit, kind=kind, phase=self.phase, nbytes=full.numel() * full.element_size(),
                   shard_nbytes=shard.numel() * shard.element_size(), dtype=str(full.dtype).removeprefix("torch."),
                   seq=len(self.records))
        if self.on_open is not None:
            self.on_open(rec, full)
        rec["start"] = self.clock.mark()
        self.records.append(rec)
        return rec

    def close(self, rec: dict | None, work) -> None:
        if rec is None:
            return
        if work is None or not isinstance(self.clock, HostClock):
            # Blocking on CPU: it has ended. On CUDA the event lands on the comm stream after the
            # collective's kernel, whether or not the call was async.
            rec["end"] = self.clock.mark()
            if self.on_close is not None:
                self.on_close(rec)
            return
        # An async gloo collective (explicit prefetch): its end is when its future completes.
        work.get_future().then(lambda _f: rec.__setitem__("end", self.clock.mark()))

    def resolved(self) -> list[dict[str, Any]]:
        """This step's records, times in seconds from the step's forward start (call after the step)."""
        out = []
        for r in self.records:
            e = {k: v for k, v in r.items() if k not in ("start", "end")}
            e["start_s"] = self.clock.seconds(self.origin, r["start"])
            e["end_s"] = self.clock.seconds(self.origin, r["end"]) if "end" in r else None
            out.append(e)
        return out


def install_recorders(units: list[tuple[str, Any]], log: CollectiveLog) -> str | None:
    """Give every FSDP unit (name, FSDPModule) a recording all-gather and reduce-scatter.

    A unit whose comm is FSDP2's default gets `RecordingAllGather` / `RecordingReduceScatter`
    (the default plus a record). A unit whose comm is the script's own (set with
    `set_custom_all_gather` / `set_custom_reduce_scatter` before its first forward: an attached
    run) gets it back inside a recorder that calls it unchanged, its `allocate` too, and notes the
    call the same way plus ``comm``, the script's class name: the bytes are those of the tensors
    FSDP2 handed that object (what it sends of them is its own affair). Units with several
    parameter groups are not given here: FSDP2 refuses custom comms on them.

    Returns None, or, where this torch's FSDP2 lacks what the recorders build on (the private
    default collectives and comm interfaces, or the `set_custom_*` hooks), why the collectives go
    unrecorded: the run trains as plain FSDP2 then, with `log.recording` False, and says so.
    """
    try:
        default_ag, default_rs = _gather_types()
        from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
    except (ImportError, AttributeError) as exc:
        log.recording = False
        return (f"FSDP collectives not recorded: torch {torch.__version__} has no {PRIVATE_COLLECTIVES}."
                f"DefaultAllGather/DefaultReduceScatter ({type(exc).__name__}: {exc}); the run trains without "
                f"fsdp_collective and comm_volume events")
    hooks = ("set_custom_all_gather", "set_custom_reduce_scatter")
    lacking = [h for h in hooks for _, mod in units[:1] if not hasattr(mod, h)]
    if lacking:
        log.recording = False
        return (f"FSDP collectives not recorded: torch {torch.__version__}'s FSDPModule has no "
                f"{' or '.join(lacking)}; the run trains without fsdp_collective and comm_volume events")

    def gather(unit: str, call: Callable, output_tensor, input_tensor, group, async_op, comm: str | None):
        rec = log.open(unit, "all_gather", output_tensor, input_tensor)
        if rec is not None and comm is not None:
            rec["comm"] = comm
        work = call(output_tensor, input_tensor, group, async_op)
        log.close(rec, work)
        return work

    def scatter(unit: str, call: Callable, output_tensor, input_tensor, group, op, async_op, comm: str | None):
        rec = log.open(unit, "reduce_scatter", input_tensor, output_tensor)
        if rec is not None and comm is not None:
            rec["comm"] = comm
        work = call(output_tensor, input_tensor, group, op, async_op)
        log.close(rec, work)
        return work

    class RecordingAllGather(default_ag):
        def __init__(self, unit: str):
            super().__init__()
            self.unit = unit

        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            return gather(self.unit, super().__call__, output_tensor, input_tensor, group, async_op, None)

    class RecordingReduceScatter(default_rs):
        def __init__(self, unit: str):
            super().__init__()
            self.unit = unit

        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            return scatter(self.unit, super().__call__, output_tensor, input_tensor, group, op, async_op, None)

    class ScriptsAllGather(AllGather):  # the script's own, called unchanged
        def __init__(self, inner: Any, unit: str):
            self.inner, self.unit = inner, unit

        def allocate(self, size, *, dtype, device):
            return self.inner.allocate(size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            return gather(self.unit, self.inner, output_tensor, input_tensor, group, async_op,
                          type(self.inner).__name__)

    class ScriptsReduceScatter(ReduceScatter):
        def __init__(self, inner: Any, unit: str):
            self.inner, self.unit = inner, unit

        def allocate(self, size, *, dtype, device):
            return self.inner.allocate(size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            return scatter(self.unit, self.inner, output_tensor, input_tensor, group, op, async_op,
                           type(self.inner).__name__)

    for name, mod in units:
        groups = mod._get_fsdp_state()._fsdp_param_groups
        ag = groups[0]._all_gather_comm if groups else None
        rs = groups[0]._reduce_scatter_comm if groups else None
        mod.set_custom_all_gather(ScriptsAllGather(ag, name) if ag is not None and type(ag) is not default_ag
                                  else RecordingAllGather(name))
        mod.set_custom_reduce_scatter(ScriptsReduceScatter(rs, name) if rs is not None and type(rs) is not default_rs
                                      else RecordingReduceScatter(name))
    return None


def exposed_comm_s(records: list[dict[str, Any]], phase: str) -> float:
    """Seconds of `phase` the training thread spent inside collectives (union of their spans).

    On CPU every FSDP2 collective blocks the training thread, so all of it is exposed."""
    spans = [(r["start_s"], r["end_s"]) for r in records if r["phase"] == phase and r["end_s"] is not None]
    return interval_union_s(spans)


def theory_bytes(world_size: int, param_numel: int, *, reshard_after_forward: bool,
                 gather_dtype_bytes: int = 4, reduce_dtype_bytes: int = 4,
                 micro_batches: int = 1) -> dict[str, int]:
    """Bytes each rank sends (= receives) per step by the textbook formulas.

    FSDP (ZeRO-3): (n-1)/n * (g * P_gather + P_reduce), g = 2 all-gathers per micro-batch with
    reshard after forward, else 1 — i.e. 3(n-1)/n * P or 2(n-1)/n * P in fp32 with one
    micro-batch. DDP: 2(n-1)/n * P (fp32). P counts elements (`param_numel`) times dtype bytes.
    """
    n = world_size
    k = (n - 1) / n if n > 0 else 0.0
    gathers = micro_batches * (2 if reshard_after_forward else 1)
    fsdp = k * (gathers * param_numel * gather_dtype_bytes + param_numel * reduce_dtype_bytes)
    return dict(fsdp=int(fsdp), ddp=int(2 * k * param_numel * 4))


def volume_fields(records: list[dict[str, Any]], backend: str | None, world_size: int,
                  theory: dict[str, int], formula: str) -> dict[str, Any]:
    """The `comm_volume` event of one FSDP rank and step (see docs/events.md)."""
    wire = sum(r["nbytes"] * wire_factor(r["kind"], backend, world_size) for r in records)
    by_kind = {k: sum(r["nbytes"] for r in records if r["kind"] == k) for k in ("all_gather", "reduce_scatter")}
    return dict(sent_bytes=int(wire), recv_bytes=int(wire), volume_source=VOLUME_SOURCE,
                all_gather_nbytes=by_kind["all_gather"], reduce_scatter_nbytes=by_kind["reduce_scatter"],
                collectives=len(records), theory_sent_bytes=theory["fsdp"], theory_recv_bytes=theory["fsdp"],
                theory_formula=formula, theory_ddp_sent_bytes=theory["ddp"])
