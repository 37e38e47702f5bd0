"""Each `DistributedDataParallel` the script builds, watched from the moment it is built.

`patch_ddp` wraps `DistributedDataParallel.__init__` (the class attribute, so every DDP built
after start-up is seen, however the script imported it) and `register_comm_hook`; `watch_ddp`
watches one DDP built before that (`ddpviz.watch(ddp)` in a process instrumented late):

- after DDP's own constructor, `Watch` registers `engine.attach.comm.timed_comm_hook` and a
  forward pre-hook and hook on the DDP module (forward time, the batch it sees, and whether DDP
  will all-reduce this forward's backward: `require_backward_grad_sync`, which `no_sync()` turns
  off, and grad mode, the two conditions DDP's forward checks before `prepare_for_backward`);
- a later `ddp.register_comm_hook(state, hook)` by the script is kept, not passed to DDP (which
  takes one hook only): `timed_comm_hook` calls it for every bucket, so training is what the
  script's hook makes it and the buckets are still timed. A built-in hook
  (`_register_builtin_comm_hook`, ALLREDUCE or FP16_COMPRESS) is run as its Python twin in
  `default_hooks` (the same operations), since DDP cannot take it beside ours.

Several DDPs in one process (a GAN's generator and discriminator): each `Watch` has a `ddp_index`
(0 for the first DDP the process built, 1 for the next, ...), carried by its `bucket` events, so
two DDPs' bucket 0 stay apart; the process still writes one `comm_volume` per step (`engine.attach.volume.VolumeBook`:
the bytes of every DDP that all-reduced in it, summed); a launched rank writes one on its traced steps and
when its bucket sizes change only (engine.modes.ddp.rank's `volume_due`).

The bucket layout comes from the hook itself: the parameters of each `GradBucket` DDP hands over
(the initial layout on the first synced backward, the rebuilt one after DDP's rebuild, which
`Reducer::rebuild_buckets` does once, in the forward after the first synced backward).

With `ddpviz run --bucket-timing recorder`, or `auto` (the default) on a gloo DDP (`nohook.bucket_timing_of`), none
of the above hooks the buckets: `Watch` registers no comm hook, the script's own hook goes to DDP unwrapped, and
the buckets come from DDP's reducer (`engine.attach.nohook`); the forward hooks stay.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpviz.engine.attach.comm import HookState, timed_comm_hook
from ddpviz.engine.attach.memory import STEPS_HINT
from ddpviz.engine.attach.nohook import NBYTES_SOURCE, NoHookBuckets, bucket_timing_of, comm_exposed
from ddpviz.engine.attach.overrides import apply_tune
from ddpviz.engine.attach.session import DeferredMarks, Session
from ddpviz.engine.attach.steps import batch_samples, compiled_away
from ddpviz.engine.attach.transparent import past_wrappers, wrapper
from ddpviz.engine.attach.volume import VolumeBook, volume_fields
from ddpviz.engine.measure.clocks import CudaClock, HostClock
from ddpviz.engine.measure.memory_sampler import should_trace_memory
from ddpviz.engine.measure.telemetry import wall_ts
from ddpviz.engine.modes.ddp.buckets import expect_sparse_gradient
from ddpviz.engine.modes.ddp.comm_hook import BucketRecorder

LAYOUT_BACKWARDS = 3  # synced backwards whose layouts are kept for run_started (DDP rebuilds once, in the 2nd)


def _layout(records: list[dict], names: dict[int, tuple[str, ...]]) -> list[dict[str, Any]]:
    return [dict(bucket_index=r["bucket_index"], nbytes=r["uncompressed_nbytes"],
                 num_params=len(names.get(r["bucket_index"], ())),
                 param_names=list(names.get(r["bucket_index"], ())), sparse=False)
            for r in sorted(records, key=lambda r: r["bucket_index"])]


class Watch(DeferredMarks):
    """The instrumentation of one DDP (see the module docstring); a watch of the step tracker
    (`engine.attach.steps`: `begin_backward`, `comm_split`, `drain` at exit)."""

    DEFERRED_PART = "bucket timing"

    carried_bytes = 0  # bytes of this step's earlier synced backwards (several backwards a step)
    _counted: Any = None  # the records a step's buckets came from (carried no more)
    reduces_gradients = True  # a backward of its forward all-reduces, unless no_sync() said not to
    # its exposed comm is the backward's time after its last bucket was ready: DDPs that reduce in
    # one backward share that time (engine.attach.steps counts the smallest of theirs once)
    exposed_after_last_ready = True
    nohook: NoHookBuckets | None = None  # bucket_timing=recorder: no comm hook (engine.attach.nohook)

    def __init__(self, session: Session, tracker: Any, ddp: DDP, register: Any):
        self.s, self.tracker, self.ddp = session, tracker, ddp
        # the module the DDP wraps (the script's model), read on every forward (`training_forward`): `ddp.module`
        # goes through nn.Module.__getattr__, 0.9 µs a read here
        self.module: torch.nn.Module = ddp.module
        self.ddp_index = sum(1 for w in tracker.watches if isinstance(w, Watch))  # built before this one
        if tracker.ddp_volume is None:
            tracker.ddp_volume = VolumeBook(session)
        self.volume: VolumeBook = tracker.ddp_volume
        device = next((p.device for p in ddp.module.parameters()), torch.device("cpu"))
        self.device = device
        session.set_device(device.type, device.index)
        self.world_size = dist.get_world_size(ddp.process_group)
        names = {p.data_ptr(): n for n, p in ddp.module.named_parameters()}
        clock = CudaClock(device) if device.type == "cuda" else HostClock()  # the DDP's device (31.5)
        rec = BucketRecorder(self.world_size, True, names, clock, group=ddp.process_group, predivided=True)
        self.state = HookState(rec, session.guard, self.world_size)
        self.state.sparse = any(expect_sparse_gradient(ddp.module))  # else no bucket is asked (per bucket, per step)
        self.layouts: list[list[dict]] = []  # the layout of each of the first synced backwards
        # the latest emitted backward's bucket records (`overlap_of`; an ordinary step's are built by the writer)
        self.last_buckets: list[dict] = []
        self._steady: tuple = (None, [], {})  # (the layout, its bucket event heads, comm_volume head): `steady_buckets`
        self.deferred: list[tuple[int, list[dict], Any]] = []  # CUDA: (step, records, origin) not yet complete
        self.param_bytes = sum(p.numel() * p.element_size() for p in ddp.module.parameters() if p.requires_grad)
        self.synced_backwards = 0  # synced backwards begun so far
        self.auto = session.bucket_timing == "auto"  # the path was ddpviz's choice (`take_hook_path`)
        timing = bucket_timing_of(session, ddp, device)
        earlier = [w for w in tracker.watches if isinstance(w, Watch)]
        # `auto` gives each DDP of a process with several the hook: only the hook sees whether a backward reached a
        # DDP (its buckets came). Without, a GAN's D step, whose backward never reaches G, counted as G's too: G's
        # buckets went on the wrong step, timed by D's profiled all-reduce or G's stale reducer stamps, and
        # comm_volume swapped between D and G steps (a new user's trial, 2026-12-06)
        if self.auto and earlier and not getattr(ddp, "_comm_hooks", None):  # DDP takes one hook: a held slot stays
            timing = "hook"
            for w in earlier:
                w.take_hook_path()
        if timing == "recorder":
            self.nohook = NoHookBuckets(ddp, names)
            for hook, _ in getattr(ddp, "_comm_hooks", None) or []:  # e.g. DDP(mixed_precision=...)'s
                self.nohook.note_script_hook(hook)
        else:
            register(ddp, self.state, timed_comm_hook)
        self.hook_ids = (ddp.register_forward_pre_hook(self._pre, with_kwargs=True).id,
                         ddp.register_forward_hook(self._post, always_call=True).id)  # a forward that raised ends
        ddp._ddpviz_watch = self


    @compiled_away
    def _pre(self, module: DDP, args: tuple, kwargs: dict) -> None:
        synced = bool(module.require_backward_grad_sync and torch.is_grad_enabled())
        self.s.guard("steps", self.tracker.forward_start, self, synced, batch_samples(args, kwargs))

    @compiled_away
    def _post(self, module: DDP, args: tuple, output: Any) -> None:
        if self.nohook is not None and module.require_backward_grad_sync and torch.is_grad_enabled():
            self.s.guard("bucket timing", self.nohook.forward_returned)  # the reducer's ready-time origin
        self.s.guard("steps", self.tracker.forward_end)

    def begin_backward(self, synced: bool) -> None:
        if synced:
            self.s.guard("bucket timing", self._begin_synced)

    def _begin_synced(self) -> None:
        """A synced backward begins: the bytes of an earlier synced backward of the same step
        (whose records the recorder drops now) are carried into the step's `comm_volume`."""
        self.synced_backwards += 1
        if self.nohook is not None:
            self.nohook.begin_backward(should_trace_memory(self.tracker.step, STEPS_HINT))
            return
        rec = self.state.recorder
        if rec.records is not self._counted:
            self.carried_bytes += sum(r["nbytes"] for r in rec.records)
        rec.begin_backward()

    def reduced_in_backward(self) -> bool:
        """Whether DDP handed the comm hook a bucket since `begin_backward` (this backward reached
        this DDP's graph). With bucket timing off or no hook (`nohook`), unknown: taken as yes."""
        if self.nohook is not None:
            return True
        return bool(self.state.recorder.records) or "bucket timing" in self.s.disabled

    def take_hook_path(self) -> bool:
        """The script registers a Python comm hook of its own on a DDP that `auto` gave the recorder path, before
        its first synced backward: from now on ddpviz's hook wraps it (`timed_comm_hook`), so its buckets' bytes
        are what the script's hook all-reduces (PowerSGD's P and Q, fp16's halves) and their times are measured;
        the script's hook already runs Python per bucket. Returns False (the recorder path stays, the script's hook
        goes to DDP unwrapped) for an explicit `--bucket-timing recorder`, after a synced backward, or where DDP
        refused ddpviz's hook."""
        if not self.auto or self.synced_backwards or self.nohook is None:
            return False
        try:
            _REGISTER(self.ddp, self.state, timed_comm_hook)
        except Exception:
            return False
        self.nohook = None
        return True

    def stop_profiling(self) -> None:
        """At a step's end and at exit: no sampled profile of this DDP outlives its step (`NoHookBuckets`)."""
        if self.nohook is not None:
            self.nohook.stop_profiling()

    def comm_split(self, step: int, micros: list[dict]) -> tuple[float, float, dict[str, Any]]:
        """(exposed comm in forward, in backward, the step's extra fields) of this DDP in `step`,
        whose backwards were `micros`: its last synced backward's time after its last bucket
        was ready (what the all-reduce added); emits that backward's buckets (`buckets`)."""
        synced = [m for m in micros if m["synced"]]
        if not synced:
            return 0.0, 0.0, {}
        last = synced[-1]
        buckets = self.buckets(step)
        last_bwd = last["t1"] - last["t0"]
        if self.nohook is not None:  # from the buckets' ready times, where measured (`nohook.comm_exposed`)
            exposed, fields = comm_exposed(buckets, last_bwd)
            return 0.0, exposed, dict(backward_start_ts=wall_ts(last["t0"]), **fields)
        ready = max((b["ready_s"] for b in buckets if b.get("ready_s") is not None), default=last_bwd)
        # CUDA: bucket times come later (`buckets`), so the exposed comm is not measured
        return 0.0, max(0.0, last_bwd - ready), dict(backward_start_ts=wall_ts(last["t0"]),
                                                     comm_exposed_measured=bool(buckets))

    def buckets(self, step: int) -> list[dict[str, Any]]:
        """Emit the `bucket` events of the synced backward of `step` (and hand them to the
        `VolumeBook`, which writes the step's `comm_volume`); returns
        its bucket records (seconds from that backward's start).

        On CUDA the marks are events on the stream, readable only once they completed: they are
        kept and emitted at a later step's end when `Event.query()` says they have (never a
        synchronize, so the script's stream is not stalled); then this returns [] and the step's
        exposed comm is not measured (`comm_exposed_measured` false)."""
        if "bucket timing" in self.s.disabled:
            return []
        self.volume.expect(step, self)
        if self.nohook is not None:
            synced = self.nohook.synced
            out = self.nohook.resolved()  # every synced backward of the step all-reduced the same layout
            self.volume.carry(step, self, max(0, synced - 1) * sum(r["nbytes"] or 0 for r in out))
            return self._emit(step, out)
        rec = self.state.recorder
        self._counted, carried, self.carried_bytes = rec.records, self.carried_bytes, 0
        self.volume.carry(step, self, carried)
        if self.device.type != "cuda":
            return self._emit(step, rec.resolved())
        self.deferred.append((step, rec.records, rec.origin))
        self._emit_completed()
        return []

    def steady_buckets(self) -> tuple[list[dict[str, Any]], list[float], dict[str, Any], Any] | None:
        """For an ordinary step (`engine.attach.steps.StepTracker._ordinary`): its one synced backward's buckets on
        the recorder path (no hook), the layout steady and reported, the step not sampled, the reducer's ready
        stamps readable (`LayoutBuckets.steady_readies`): (the bucket events' heads, each bucket's ready time in s
        from the backward's start, the `comm_volume` event's head, `comm_exposed`). The events built from them are
        the ones `buckets` and the `VolumeBook` emit on such a step (tests/engine/test_attach_ordinary.py), without
        their per-step work on the script's thread. None otherwise, and the caller takes `buckets`."""
        nh = self.nohook
        if nh is None or nh.synced != 1 or nh.read_flight or nh.script_hook is not None \
                or len(self.layouts) < LAYOUT_BACKWARDS or self.volume.steps or "bucket timing" in self.s.disabled:
            return None
        reader = nh.layout_reader
        readies = reader.steady_readies()
        if readies is None:
            return None
        nh.synced = 0
        if self._steady[0] is not reader._layout:
            rows = [dict(r, nbytes_source=NBYTES_SOURCE) for r in reader.steady_rows()]
            tel = self.s.tel
            self._steady = (reader._layout, [tel.head("bucket", ddp_index=self.ddp_index, **r) for r in rows],
                            tel.head("comm_volume", **volume_fields([(self, rows)], {})))
        return self._steady[1], readies, self._steady[2], comm_exposed

    def _emit_completed(self) -> None:
        rec = self.state.recorder
        while self.deferred and _completed(self.deferred[0]):
            st, records, origin = self.deferred.pop(0)
            saved = rec.records, rec.origin
            rec.records, rec.origin = records, origin
            try:
                resolved = rec.resolved()
            finally:
                rec.records, rec.origin = saved
            self._emit(st, resolved)

    def _item_marks(self, item: tuple[int, list[dict], Any]) -> list[Any]:
        return _marks(item)

    def _emit(self, step: int, out: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if len(self.layouts) < LAYOUT_BACKWARDS:
            self.layouts.append(self.nohook.layout() if self.nohook is not None
                                else _layout(out, self.state.recorder.layout))
        self.last_buckets = out
        self.s.emit_many("bucket", out, step=step, ddp_index=self.ddp_index)
        self.volume.add(step, self, out)
        return out

    def unwatched_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """`state` (the DDP's `__getstate__`, what `torch.save(ddp)`, `pickle` and `copy.deepcopy` keep) as it is
        without ddpviz: no `_ddpviz_watch`, none of this watch's forward hooks (its handles' ids, out of every
        `_forward*` dict), and in `_comm_hooks` the script's own hook where ddpviz's wrapped it, else nothing. So
        a DDP saved whole in an attached script loads where ddpviz is not installed (before 2026-12-06 its pickle
        named ddpviz's modules: "No module named 'ddpviz'" on loading it elsewhere; found by a new user). The
        dicts and list are new ones: `state` shares them with the live DDP."""
        out = dict(state)
        out.pop("_ddpviz_watch", None)
        for name, value in state.items():
            if name.startswith("_forward") and isinstance(value, dict) and any(i in value for i in self.hook_ids):
                out[name] = type(value)((k, v) for k, v in value.items() if k not in self.hook_ids)
        hooks = state.get("_comm_hooks")
        if hooks and any(st is self.state for _, st in hooks):
            # a built-in hook (`_register_builtin_comm_hook`) runs in C++ without ddpviz: DDP lists no Python hook
            user = (None, None) if self.state.user_builtin else (self.state.user_hook, self.state.user_state)
            out["_comm_hooks"] = [user if st is self.state else (h, st) for h, st in hooks
                                  if st is not self.state or user[0] is not None]
        return out

    def preview(self) -> dict[str, Any]:
        """`run_started`'s `bucket_preview`, from the buckets DDP handed the hook."""
        ddp = self.ddp
        cap = int(ddp.bucket_bytes_cap)
        first = dist._DEFAULT_FIRST_BUCKET_BYTES if getattr(ddp, "bucket_bytes_cap_default", False) else cap
        return dict(initial=self.layouts[0] if self.layouts else [],
                    rebuilt=self.layouts[-1] if self.layouts else [],
                    first_bucket_cap_bytes=first, bucket_cap_bytes=cap,
                    source="measured: the GradBuckets DDP handed the comm hook (first and latest synced backward)"
                    if self.nohook is None else "measured: DDP's reducer layout (first and latest synced backward)")


def _marks(item: tuple[int, list[dict], Any]) -> list[Any]:
    _, records, origin = item
    return [origin] + [r[k] for r in records for k in ("ready", "comm_start", "comm_end") if k in r]


def _completed(item: tuple[int, list[dict], Any]) -> bool:
    return all(m.query() for m in _marks(item) if m is not None) and all("comm_end" in r for r in item[1])


_REGISTER = DDP.register_comm_hook  # DDP's own, before patch_ddp wraps it


class HookTaken(RuntimeError):
    """A DDP that got its comm hook before ddpviz saw it: DDP takes one hook only, so its buckets
    cannot be timed."""


def watch_ddp(session: Session, tracker: Any, ddp: DDP) -> Watch | None:
    """The `Watch` of `ddp`: the one it has, or a new one (None when the "ddp" part is off).

    Raises:
        HookTaken: `ddp` already has a comm hook that ddpviz did not wrap (registered before
            `install`); DDP refuses a second one (torch/nn/parallel/distributed.py,
            `register_comm_hook`: "can only be registered once").
    """
    watch = getattr(ddp, "_ddpviz_watch", None)
    if watch is not None:
        return watch
    device = next((p.device for p in ddp.module.parameters()), torch.device("cpu"))
    if getattr(ddp, "_comm_hooks", None) and bucket_timing_of(session, ddp, device) != "recorder":  # it needs none
        raise HookTaken("this DistributedDataParallel got a comm hook before ddpviz was installed; "
                        "its buckets are not timed (start the script with `ddpviz run` to have them)")
    watch = session.guard("ddp", Watch, session, tracker, ddp, _REGISTER)
    if watch is not None:
        tracker.watches.append(watch)
    return watch


def patch_ddp(session: Session, tracker: Any) -> None:
    """Wrap `DDP.__init__` and `DDP.register_comm_hook` (see the module docstring)."""
    init, register = DDP.__init__, DDP.register_comm_hook

    @wrapper
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        with past_wrappers(init):  # DDP's warnings name the script's line, as without ddpviz
            init(self, *args, **kwargs)
        try:
            watch_ddp(session, tracker, self)
        except HookTaken as exc:  # e.g. DDP(mixed_precision=...) registers its own upcast hook
            session.note(f"rank {session.rank}: {exc}")

    @functools.wraps(register)
    def register_comm_hook(self, state, hook):
        watch = getattr(self, "_ddpviz_watch", None)
        if watch is None or watch.state.user_hook is not None:
            return register(self, state, hook)  # not watched, or a second hook: DDP says what it says
        if hasattr(self, "_check_comm_hook"):  # DDP's own checks first (e.g. bf16 hooks need CUDA and NCCL)
            self._check_comm_hook(hook)
        watch.state.user_state, watch.state.user_hook = state, hook
        with contextlib.suppress(Exception):  # DDP's logging data names the script's hook, as without ddpviz
            self.logger._set_comm_hook_name(hook.__qualname__)
        if watch.nohook is not None and not watch.take_hook_path():  # no hook of ours: DDP runs the script's
            watch.nohook.note_script_hook(hook)
            return register(self, state, hook)
        return None

    builtin = DDP._register_builtin_comm_hook

    @functools.wraps(builtin)
    def _register_builtin_comm_hook(self, comm_hook_type):
        # DDP takes one hook; ours is in place, so a built-in one runs as its Python twin
        # (torch.distributed.algorithms.ddp_comm_hooks.default_hooks: the same ops)
        watch = getattr(self, "_ddpviz_watch", None)
        twin = _python_twin(comm_hook_type)
        if watch is not None and watch.nohook is not None:  # no hook of ours: DDP runs the built-in one
            watch.nohook.note_script_hook(comm_hook_type)
            return builtin(self, comm_hook_type)
        if watch is None or watch.state.user_hook is not None or twin is None:
            return builtin(self, comm_hook_type)
        watch.state.user_state, watch.state.user_hook = self.process_group, twin
        watch.state.user_builtin = True  # DDP keeps no Python hook of it (`unwatched_state`)
        return None

    getstate = DDP.__getstate__

    @functools.wraps(getstate)
    def __getstate__(self):
        state = getstate(self)
        watch = self.__dict__.get("_ddpviz_watch")
        if not isinstance(watch, Watch):
            return state
        # failed: the state with ddpviz's objects, which pickle as inert `Detached` ones (session.PickledAsDetached)
        return session.guard("pickling", watch.unwatched_state, state) or state

    DDP.__init__ = __init__
    DDP.__getstate__ = __getstate__
    DDP.register_comm_hook = register_comm_hook
    DDP._register_builtin_comm_hook = _register_builtin_comm_hook
    apply_tune(session, tracker)  # `ddpviz tune`'s trial settings (engine.attach.overrides), if any


def _python_twin(comm_hook_type: Any):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return {dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
            dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook}.get(comm_hook_type)
