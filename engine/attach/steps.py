"""Steps of an attached run, from what the script does: forward (each watched DDP's forward),
backward (`Tensor.backward`), the optimizer step (PyTorch's global optimizer step hooks,
`torch.optim.optimizer.register_optimizer_step_pre_hook` / `..._post_hook`).

Where a step ends, one rule per process (`step_source` in each step event says which):

- "optimizer" (the default): when an optimizer step returns after at least one backward since
  the previous step; the index counts those optimizer steps from 0 (a second optimizer stepped in
  the same iteration adds no step; an optimizer that wraps another, e.g.
  ZeroRedundancyOptimizer, counts once);
- "explicit": at each `explicit_step` call (the public `ddpviz.step()`), from the process's first
  call on, or from its start after `use_explicit_steps` (`ddpviz.watch(..., steps="explicit")`).
  Optimizer steps then end no step; their time is summed into `optimizer_s`. A first call that
  comes right after an optimizer-ended step, with nothing of the next step begun, switches the rule
  and ends no step (that step is already written); otherwise it ends the step it is in.

Its events (docs/events.md, "attached runs"; their fields and sources: `engine.attach.step_events`):

- `step`: `step_time_s` from the previous step's end (step 0: its first forward's start) to this
  one's, so the script's data loading and its own code are inside it, as `other_s`;
  `forward_s` (Σ the wrapped module's forward calls), `backward_s` (Σ `backward()` calls, less
  the exposed comm), `comm_exposed_s` (the synced backward's time after its last bucket was
  ready: what the all-reduce added), `optimizer_s`; `loss` = Σ of the scalar tensors
  `backward()` was called on in the step (inside an optimizer step's closure, its first evaluation's only: LBFGS
  evaluates it again on the same batch, as it does the samples) (on CUDA read once it reached the host, `LossReading`: the step's
  event may then be written a step later); `samples` = the batch dimension of the first tensor the wrapped
  module received, Σ over micro-steps, × world_size (`samples_source` says so);
  `loss_source` says which tensors: under a `GradScaler` the loss given to `scaler.scale` (the
  unscaled one), not the scaled tensor `backward()` got (`note_scaled`);
  `micro_steps`, `no_sync_micro_steps` (backwards whose forward ran under `no_sync()` /
  `require_backward_grad_sync = False`: DDP all-reduced nothing in them); in a process without a
  DDP every `backward()` is a micro-step and forward time is not seen (`forward_s` null, the forward inside
  `other_s`; the step still runs from the previous step's end), samples not either (null, and samples_per_s
  null: `SAMPLES_NOT_SEEN`);
- `bucket` (the synced backward's buckets), as a launched DDP rank emits them, and `comm_volume` every step.

Backwards are `Tensor.backward` and `torch.autograd.backward` (the one inside the other counted
once). A forward run without autograd (`torch.no_grad()`, `torch.inference_mode()`) or with the
module in `eval()` is no training forward: it adds no samples, no forward time, and no backward
waits for it (an evaluation pass through the DDP module).

Every hook runs under the session's guard (`engine.attach.session.Session.guard`).
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any, Callable

import torch

from ddpviz.engine.attach.session import Detached, Session
from ddpviz.engine.batching import Later
from ddpviz.engine.attach.step_events import (EXPLICIT_LOSS_SOURCE, EXPLICIT_SAMPLES_SOURCE, LOSS_NOT_SEEN,
                                              LOSS_SOURCE, SAMPLES_NOT_SEEN, SAMPLES_SOURCE, SCALED_LOSS_SOURCE,
                                              STEP_SOURCES, attached_fields, ordinary_events, ordinary_tail)
from ddpviz.engine.measure.deferred import LossReading
from ddpviz.engine.measure.telemetry import now

NOT_A_MICRO_STEP: dict = {}  # `backward_start`'s answer for a backward whose loss counts but that is no micro-step
# said once where a backward follows only forwards of the watched model in eval() mode (a fine-tuning script that
# keeps BatchNorm's statistics frozen that way): before 2026-12-07 such a script was recorded as no step at all, and
# nothing said why (found by a helper's trial)
EVAL_NOTE = ("a backward() followed forwards of the watched model in eval() mode with autograd on: ddpviz records "
             "steps from training forwards only (model.train(); that is how it tells evaluation passes apart), so "
             "these steps are not recorded. Keep the model in train() mode and freeze what you need per module "
             "(e.g. BatchNorm layers' eval()) to have them recorded")


def _is_compiling() -> Callable[[], bool]:
    fn = getattr(getattr(torch, "compiler", None), "is_compiling", None)  # torch >= 2.3
    return fn or getattr(torch._dynamo, "is_compiling", lambda: False)


is_compiling = _is_compiling()


# set (at trace time, and replayed by each compiled call) once a hook of ddpviz's was traced by TorchDynamo
COMPILED: dict[str, bool] = {}
COMPILED_NOTE = ("the script compiles a module ddpviz watches (torch.compile of its DDP or model): ddpviz's "
                 "forward hooks stand aside inside compiled code, so those forwards are not timed and their steps "
                 "not recorded; compiling the model inside DDP (DDP(torch.compile(model)), nanoGPT's way) is "
                 "recorded")


def compiled_away(hook: Callable) -> Callable:
    """A module hook of ddpviz's that does nothing while TorchDynamo traces it (`torch.compile` of the script's
    module; `COMPILED` notes it). Traced, its clock reads were a graph break inside ddpviz's code with a
    warning on every rank ("Dynamo does not know how to trace the builtin time.perf_counter"; an exception under
    `warnings.filterwarnings("error")`), and the script's compiled graph was not the one it gets without ddpviz
    (found 2026-12-06). Traced as nothing, it leaves the script's graph as it is; such forwards are not timed
    (`COMPILED_NOTE`). Outside tracing the hook runs: one flag read per call."""
    import functools

    @functools.wraps(hook)
    def hook_unless_compiling(*args: Any, **kwargs: Any) -> Any:
        if is_compiling():
            COMPILED["traced"] = True
            return None
        if type(args[0]) is Detached:  # a deep copy's hook (copy keeps the function, its self detached)
            return None
        return hook(*args, **kwargs)

    return hook_unless_compiling


def batch_samples(args: tuple, kwargs: dict) -> int:
    """The leading dimension of the first tensor in a forward call's arguments (0 if none):
    what the wrapped module saw of the batch."""
    if args and isinstance(args[0], torch.Tensor):  # the usual `model(x)`, on every forward: no walk
        return int(args[0].shape[0]) if args[0].dim() else 1
    stack = list(args) + list(kwargs.values())
    while stack:
        x = stack.pop(0)
        if isinstance(x, torch.Tensor):
            return int(x.shape[0]) if x.dim() else 1
        if isinstance(x, (list, tuple)):
            stack[:0] = list(x)
        elif isinstance(x, dict):
            stack[:0] = list(x.values())
    return 0


class StepTracker:
    """Builds the step events of one process. `watches` are the `engine.attach.ddp.Watch`es
    and the `engine.attach.fsdp.FsdpWatch`, `modules` the `engine.attach.api.ModuleWatch`es.

    A watch feeds `forward_start(watch, synced, samples)` / `forward_end()` from its forward
    hooks and has `begin_backward(synced)` (called as a backward of its forward starts) and
    `comm_split(step, micros) -> (exposed_fwd_s, exposed_bwd_s, extra_fields)` (called once at
    the end of a step it ran in, with its micro-steps; it emits its own comm events there).
    `reduces_gradients` (class attribute, default False) marks DDP and FSDP2, whose unsynced
    micro-steps count as `no_sync_micro_steps`."""

    def __init__(self, session: Session, on_step: Callable[[int, dict], None] | None = None):
        self.s = session
        self.on_step = on_step  # called after each step's events (run_started, memory)
        self.watches: list[Any] = []
        self.modules: list[Any] = []  # engine.attach.api.ModuleWatch: models registered by ddpviz.watch()
        self.memory: Any = None  # engine.attach.memory.MemoryWatch, set by install
        self.ddp_volume: Any = None  # engine.attach.volume.VolumeBook, set by the first DDP watched
        # (watch, synced) of each watched forward whose backward has not come yet, one per watch, in
        # order: a GAN's D(G(z)) runs two DDPs' forwards before one backward, which reduces both; a
        # DCGAN's `fake = G(z)` is reduced only by the next step's backward (the D step's backward
        # reaches D alone), so these outlive the step they were made in
        self.pending: list[tuple[Any, bool]] = []
        self.step = 0
        self.prev_end: float | None = None
        self.opt_depth = 0
        self.closure_evaluated = False  # inside an optimizer step: its closure's first evaluation has run
        self.explicit = False  # steps end at explicit_step only (see the module docstring)
        self.unsent: list[tuple[int, dict, LossReading]] = []  # ended steps whose loss is still on the GPU
        self.scaled: list[tuple[Any, torch.Tensor]] = []  # (weakref to GradScaler.scale's output, its input)
        self._in_backward = threading.local()  # inside a recorded backward: torch.autograd.backward within counts once
        self._step_head: dict | None = None  # the step event's constant part (`Telemetry.head`), for `_ordinary`
        self.eval_with_grad = False  # a watched module ran a forward in eval() mode with autograd on (`EVAL_NOTE`)
        self._fresh()

    def _fresh(self) -> None:
        self.start: float | None = None
        self.forward_s = 0.0
        self.fwd_seen = False  # a training forward of a watched module ran in this step (else forward_s is None)
        self.fwd_t0: float | None = None
        self.micro: list[dict] = []
        self.losses: list[torch.Tensor] = []
        self.loss_scaled = False  # a loss came from GradScaler.scale's input
        self.samples = 0
        self.fwd_skip = False  # the running outermost forward is no training forward
        self.opt_t0: float | None = None  # the running (outermost) optimizer step's start
        self.optimizer_s = 0.0  # explicit steps: Σ the optimizer steps' own time in this step
        self.fwd_depth = 0  # > 1 inside a watched forward called from another's
        self.given: tuple[int | None, Any] = (None, None)  # (samples, loss) given to explicit_step

    # -- forward (called by engine.attach.ddp) --------------------------------------------------
    def forward_start(self, watch: Any, synced: bool, samples: int) -> None:
        self.fwd_depth += 1
        if self.fwd_depth > 1:  # e.g. the watched module a watched DDP wraps: counted once, outside
            return
        if not training_forward(watch):  # evaluation: no samples, no time, no backward waits for it
            self.fwd_skip = True
            self.eval_with_grad = self.eval_with_grad or torch.is_grad_enabled()
            return
        t = now()
        if self.start is None:
            self.start = self.prev_end if self.prev_end is not None else t
            if self.memory is not None:
                self.s.guard("memory", self.memory.step_start, self.step, watch)
        self.fwd_t0 = t
        self.fwd_seen = True
        self.pending = [p for p in self.pending if p[0] is not watch] + [(watch, synced)]
        if not (self.opt_depth and self.closure_evaluated):  # a closure's re-evaluation: the same batch again
            self.samples += samples

    def forward_end(self) -> None:
        self.fwd_depth = max(0, self.fwd_depth - 1)
        if self.fwd_depth:
            return
        if self.fwd_skip:
            self.fwd_skip = False
            return
        if self.fwd_t0 is not None:
            self.forward_s += now() - self.fwd_t0
            self.fwd_t0 = None

    # -- backward (Tensor.backward, torch.autograd.backward) ------------------------------------
    def note_scaled(self, scaled: torch.Tensor, loss: torch.Tensor) -> None:
        """`GradScaler.scale(loss)` returned `scaled`: a backward on it records `loss` instead."""
        self.scaled = [(r, v) for r, v in self.scaled[-7:] if r() is not None] + [(weakref.ref(scaled), loss.detach())]

    def _unscaled(self, loss: torch.Tensor) -> torch.Tensor:
        for ref, value in self.scaled:
            if ref() is loss:
                self.loss_scaled = True
                return value
        return loss.detach()

    def backward_start(self, loss: Any) -> dict | None:
        """A backward of `loss` (a tensor, or the tensors given to `torch.autograd.backward`)
        begins. Returns its micro-step record, or None when it is not one (nested in a recorded
        backward; after no training forward of a watched DDP), or `NOT_A_MICRO_STEP` for a later backward of a
        step's forward (its loss counted; `backward_end` takes it back)."""
        if getattr(self._in_backward, "on", False):
            return None
        if not self.pending and self.watches:  # a DDP script: a backward after no DDP forward is no micro-step of it
            if not self.micro:
                if self.eval_with_grad:  # the script trains its model in eval() mode: say why nothing is recorded
                    self.s.note(EVAL_NOTE)
                return None
            # but its loss is the step's too (`l1.backward(retain_graph=True); l2.backward()`), counted once: the
            # torch.autograd.backward inside this Tensor.backward is nested in it
            self._add_losses(loss)
            self._in_backward.on = True
            return NOT_A_MICRO_STEP
        self._in_backward.on = True
        candidates = list(self.pending)  # [] with no DDP in this process (one device, nn.DataParallel)
        for w, sy in candidates:
            w.begin_backward(sy)
        self._add_losses(loss)
        if self.start is None:  # no forward seen (no DDP in this process): the step still runs from the last one's end
            self.start = self.prev_end if self.prev_end is not None else now()
        m = dict(watch=None, synced=False, t0=now(), candidates=candidates, views=[])
        self.micro.append(m)
        return m

    def _add_losses(self, loss: Any) -> None:
        """The one-element tensors a backward got, into the step's loss; inside an optimizer step's closure
        (`opt.step(closure)`) only its first evaluation's: LBFGS evaluates the closure again and again on the
        same batch, and its step returns the first (a new user's LBFGS loss read 14.31 against the script's
        7.10, 2026-12-06)."""
        if self.opt_depth:
            if self.closure_evaluated:
                return
            self.closure_evaluated = True
        for t in ([loss] if isinstance(loss, torch.Tensor) else list(loss)):
            if isinstance(t, torch.Tensor) and t.numel() == 1:
                self.losses.append(self._unscaled(t))

    def backward_end(self, m: dict) -> None:
        """The backward of `m` ended: the pending forwards it reached are its `views` (an unsynced
        one, whose DDP reduces nothing, is reached by the first backward after it; a synced one by
        the backward in which its DDP reduced, `reduced_in_backward`); the others stay pending."""
        self._in_backward.on = False
        if m is NOT_A_MICRO_STEP:
            return
        m["t1"] = now()
        reached = [(w, sy) for w, sy in m["candidates"]
                   if not sy or getattr(w, "reduced_in_backward", lambda: True)()]
        self.pending = [p for p in self.pending if p not in reached]
        m["views"] = reached
        if reached:
            m["watch"], m["synced"] = reached[-1]

    # -- optimizer ------------------------------------------------------------------------------
    def optimizer_start(self, opt: Any = None) -> None:
        if self.memory is not None and opt is not None:
            self.s.guard("memory", self.memory.optimizer_seen, opt)
        self.opt_depth += 1
        if self.opt_depth == 1:
            self.opt_t0 = now()
            self.closure_evaluated = False  # the step's closure (if any) not evaluated yet

    def optimizer_end(self, opt: Any = None) -> None:
        """At an outermost optimizer step's end. Its own time runs from its start, or from the end
        of the last backward it ran itself (a closure, `opt.step(closure)`: LBFGS, Lightning's
        automatic optimization), to now. Hook rule: it ends the step if a backward came before or
        inside it; an optimizer step after no backward (a second optimizer in the iteration) ends none."""
        self.opt_depth = max(0, self.opt_depth - 1)
        if self.opt_depth or self.opt_t0 is None:
            return
        end, t0 = now(), self.opt_t0
        self.opt_t0 = None
        own_start = max([t0] + [m["t1"] for m in self.micro if "t1" in m and m["t0"] >= t0])
        if self.explicit:  # the step ends at explicit_step; this optimizer's time is part of it
            self.optimizer_s += end - own_start
        elif self.micro:
            self.optimizer_s = end - own_start
            self._end_step(end)

    # -- explicit steps (engine.attach.api, the public ddpviz.step) -------------------------------
    def use_explicit_steps(self) -> None:
        """From now on only `explicit_step` ends steps."""
        self.explicit = True

    def explicit_step(self, samples: int | None = None, loss: Any = None) -> bool:
        """End the current step here (see the module docstring). `samples`: this rank's samples
        in the step; `loss`: a float or a one-element tensor (read when the event is written).
        Returns False for the first call that only switched the rule (no step ended)."""
        end = now()
        if not self.explicit:
            self.explicit = True
            begun = self.start is not None or bool(self.micro)
            if self.step > 0 and not begun:
                return False
        if self.start is None:
            self.start = self.prev_end if self.prev_end is not None else end
        if self.opt_t0 is not None:  # called from inside an optimizer step: its time so far counts
            self.optimizer_s += end - self.opt_t0
        self.given = (samples, loss)
        self._end_step(end)
        return True

    def _end_step(self, end: float) -> None:
        ordinary = False
        try:
            ordinary = self._ordinary(end)
            if not ordinary:
                self._emit_step(end)
        finally:
            if self.memory is not None and self.memory._open is not None:  # the step failed to close it
                try:  # whatever is switched off: a traced step left open would slow every step after it
                    self.memory.abandon()
                except Exception:
                    pass
            if not ordinary:  # an ordinary step's one DDP ran no profile (`LayoutBuckets.steady_readies`)
                self.stop_profiling()
            self.prev_end = end
            self.step += 1
            self._fresh()

    def _ordinary(self, end: float) -> bool:
        """Hand over an ordinary step's events to be built on the event writer's thread, and say whether it did.
        Ordinary: after step 0, micro-steps of the process's one DDP of which only the last all-reduced (a
        script's `no_sync()` accumulation, or one micro-step), on the recorder path with its layout steady
        (`engine.attach.ddp.Watch.steady_buckets`), a forward seen, the losses on the CPU, nothing given to
        `explicit_step`, no memory trace open, no earlier step waiting for its loss. Its events (buckets,
        comm_volume, step) are `_emit_step`'s for such a step (tests/engine/test_attach_ordinary.py); this thread
        keeps the readings only (issue 31: an attached small step's own cost, docs/measured.md). Else False, and
        `_emit_step` does the step."""
        micro, losses = self.micro, self.losses
        if self.step == 0 or not micro or not losses or len(self.watches) != 1 or self.unsent or not self.fwd_seen \
                or self.samples <= 0 or self.given != (None, None) \
                or (self.memory is not None and self.memory._open is not None):
            return False
        last = micro[-1]
        watch = last["watch"]
        if not last["synced"] or any(m["synced"] or m["watch"] is not watch for m in micro[:-1]) \
                or any(len(m["views"]) != 1 or "t1" not in m for m in micro) \
                or any(t.device.type != "cpu" for t in losses):
            return False
        steady = self.s.guard("bucket timing", getattr(watch, "steady_buckets", _none))
        if steady is None:
            return False
        if self._step_head is None:
            self._step_head = self.s.tel.head("step")
        tail = ordinary_tail(len(micro), self.explicit, self.loss_scaled)
        heads, readies, volume_head, exposed_of = steady
        backward_s = sum(m["t1"] - m["t0"] for m in micro)
        loss = float(sum(float(v) for v in losses))  # `LossReading`'s sum, in its order
        self.s.tel.hand_over_later(Later(ordinary_events, (
            self._step_head, heads, volume_head, exposed_of, time.time(), self.step, readies, self.start, end,
            self.forward_s, backward_s, last["t0"], last["t1"], self.optimizer_s, loss,
            self.samples * self.s.world_size, tail), len(heads) + 2))
        if self.on_step is not None:
            self.on_step(self.step, None)
        return True

    def _emit_step(self, end: float) -> None:
        samples, loss = self.given
        step, micro = self.step, [m for m in self.micro if "t1" in m]
        bwd = sum(m["t1"] - m["t0"] for m in micro)
        exposed_fwd = exposed_bwd = 0.0
        extra: dict[str, Any] = {}
        views = [dict(m, watch=w, synced=sy) for m in micro for w, sy in m["views"]]
        shared: dict[float, float] = {}  # a synced backward's start -> its exposed comm
        for watch in dict.fromkeys(v["watch"] for v in views if v["watch"] is not None):
            mine = [v for v in views if v["watch"] is watch]
            f, b, more = watch.comm_split(step, mine)
            exposed_fwd += f
            last = [v["t0"] for v in mine if v["synced"]][-1:]
            if last and getattr(watch, "exposed_after_last_ready", False):
                # DDPs reducing in one backward (a GAN's D(G(z))): its time after the last bucket of
                # any of them was ready, i.e. the smallest of their figures, counted once
                shared[last[0]] = min(b, shared.get(last[0], b))
            else:
                exposed_bwd += b
            extra.update(more)
        exposed_bwd += sum(shared.values())
        if self.ddp_volume is not None:
            self.s.guard("bucket timing", self.ddp_volume.close, step)
        bwd -= exposed_bwd
        seen = samples is not None or self.samples > 0
        source = EXPLICIT_SAMPLES_SOURCE if samples is not None else SAMPLES_SOURCE if seen else SAMPLES_NOT_SEEN
        reading = LossReading([loss] if loss is not None else self.losses)
        loss_source = EXPLICIT_LOSS_SOURCE if loss is not None else (
            SCALED_LOSS_SOURCE if self.loss_scaled else LOSS_SOURCE if self.losses else LOSS_NOT_SEEN)
        fields = attached_fields(
            self.start, end, self.forward_s - exposed_fwd, self.fwd_seen, bwd, exposed_fwd + exposed_bwd,
            self.optimizer_s, ((self.samples if samples is None else samples) * self.s.world_size) if seen else None,
            extra, micro_steps=len(micro),
            no_sync_micro_steps=sum(1 for m in micro if _syncs(m["watch"]) and not m["synced"]),
            samples_source=source, step_source=STEP_SOURCES[self.explicit], loss_source=loss_source)
        if self.memory is not None:
            self.s.guard("memory", self.memory.step_end, fields)
        self.unsent.append((step, fields, reading))
        self.send_steps()
        if self.on_step is not None:
            self.on_step(step, fields)

    def send_steps(self, wait: bool = False) -> None:
        """Emit the ended steps whose loss has reached the host, in step order (`wait`: all of
        them, waiting for their losses: at exit)."""
        while self.unsent and (wait or self.unsent[0][2].ready()):
            step, fields, reading = self.unsent.pop(0)
            fields["loss"] = reading.wait() if wait else reading.read()
            self.s.emit("step", step=step, **fields)

    def close(self) -> None:
        """At exit: every step still waiting for its loss is emitted, and each watch's events
        still waiting for the GPU (`drain`: CUDA events of the last steps) after it."""
        self.send_steps(wait=True)
        for watch in self.watches:
            if hasattr(watch, "drain"):
                watch.drain()

    def stop_profiling(self) -> None:
        """Stop any sampled step's profile still running (a part raised before reading it), whatever is switched
        off: PyTorch's profiler left running crashed the script at its exit (`SampledSpans.stop`). At each step's
        end and at exit."""
        for watch in self.watches:
            try:
                getattr(watch, "stop_profiling", lambda: None)()
            except Exception:
                pass

    def release(self) -> None:
        """At exit, once nothing more is recorded: drop ddpviz's references to the script's DDPs
        and models, so one the script no longer holds goes now, with its process group and gloo
        threads, while the interpreter is alive — as it would without ddpviz — not at finalization
        (tests/engine/test_attach_release.py)."""
        self.watches.clear()
        self.ddp_volume = None
        self.memory = None


def training_forward(watch: Any) -> bool:
    """Whether a forward of `watch`'s module, starting now, trains: autograd on (not under
    `torch.no_grad()` / `torch.inference_mode()`) and the model (the module a DDP wraps, or the
    watched model) in `train()` mode. The model's flag, not the DDP wrapper's: Lightning puts its
    LightningModule back in train() after validation but leaves the DDP wrapper's flag as it was."""
    if not torch.is_grad_enabled():
        return False
    return bool(getattr(getattr(watch, "module", None), "training", True))


def _syncs(watch: Any) -> bool:
    """A watch whose backward reduces gradients unless the script skips it (DDP, FSDP2)."""
    return bool(getattr(watch, "reduces_gradients", False))


def _none() -> None:
    return None
