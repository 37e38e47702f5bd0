"""What the public `ddpviz` package (`ddpviz.watch`, `ddpviz.step`) does in a process of an attached run.

- `ensure_installed`: the process's session, installed now if the start-up hook did not (a process
  `ddpviz run` reaches only through its environment: behind a shell script, or started by
  `torch.multiprocessing.spawn`). Such a process takes its rank and world size from
  `torch.distributed` when torchrun's variables are missing and a process group is up.
- `watch_model`: registers a model by hand. A `DistributedDataParallel` built before the
  instrumentation was installed gets the same `engine.attach.ddp.Watch` as one built after; any
  other module (one device, `nn.DataParallel`, an FSDP2 module) gets a `ModuleWatch`, which times
  its forward and counts the batch it sees (what a DDP's watch does, without buckets).
- `step`: an explicit step boundary (`engine.attach.steps`, "explicit").
- `flush`: `run_started` if due, and every event buffered so far written to the spool.

Everything runs under the session's guard (`engine.attach.session.Session.guard`): an error
switches that part off, is said once, and training goes on.
"""

from __future__ import annotations

import numbers
import operator
import os
from typing import Any, Iterable

import torch

from ddpviz.engine.attach.session import PickledAsDetached, Session
from ddpviz.engine.attach.steps import StepTracker, batch_samples, compiled_away


def ensure_installed(environ: dict[str, str] | None = None) -> Session:
    """This process's session (`engine.attach.install`), installed now if needed.

    Raises:
        KeyError, OSError, RuntimeError: from `engine.attach.install` (the caller fails open).
    """
    from ddpviz.engine.attach import install, installed

    s = installed()
    if s is not None:
        return s
    env = dict(os.environ if environ is None else environ)
    if not env.get("RANK") and torch.distributed.is_available() and torch.distributed.is_initialized():
        env["RANK"] = str(torch.distributed.get_rank())
        env["WORLD_SIZE"] = str(torch.distributed.get_world_size())
    return install(env)


class ModuleWatch(PickledAsDetached):
    """A model registered by `ddpviz.watch()` that is not a DDP: its forward's time and the
    leading dimension of the first tensor it receives (this rank's samples), fed to the step
    tracker like a DDP's forward that all-reduces nothing (`synced` False; not a no_sync micro-step).

    Attributes:
        module: the model; device: the device of its first parameter (cpu without parameters).
    """

    def __init__(self, session: Session, tracker: StepTracker, module: torch.nn.Module):
        self.s, self.tracker, self.module = session, tracker, module
        self.device = next((p.device for p in module.parameters()), torch.device("cpu"))
        if not tracker.watches and not tracker.modules:
            session.set_device(self.device.type, self.device.index)
        module.register_forward_pre_hook(self._pre, with_kwargs=True)
        module.register_forward_hook(self._post, always_call=True)  # a forward that raised still ends

    @compiled_away
    def _pre(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        self.s.guard("steps", self.tracker.forward_start, self, False, batch_samples(args, kwargs))

    @compiled_away
    def _post(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        self.s.guard("steps", self.tracker.forward_end)

    def begin_backward(self, synced: bool) -> None:
        pass  # nothing of its backward is recorded

    def comm_split(self, step: int, micros: list[dict]) -> tuple[float, float, dict]:
        return 0.0, 0.0, {}  # no collectives seen: none exposed


def watch_model(s: Session, model: torch.nn.Module) -> None:
    """Register `model` (see the module docstring); a model already watched (itself, or as the
    module of a watched DDP) is left as it is."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddpviz.engine.attach.ddp import HookTaken, watch_ddp

    tracker = s.tracker
    if any(w.ddp is model or w.module is model for w in tracker.watches) or \
            any(w.module is model for w in tracker.modules):
        return
    if isinstance(model, DDP):
        try:
            if watch_ddp(s, tracker, model) is not None:
                return
        except HookTaken as exc:
            s.note(f"rank {s.rank}: {exc}; its forward and steps are still recorded")
    if "steps" not in s.disabled:
        tracker.modules.append(ModuleWatch(s, tracker, model))


def watch_optimizer(s: Session, opt: torch.optim.Optimizer) -> None:
    """Register `opt`: its state counts in the memory ledger's tensors from the first traced step
    on (otherwise from its first `step()`)."""
    if s.memory is not None and all(o is not opt for o in s.memory.optimizers):
        s.memory.optimizers.append(opt)


def step(s: Session, samples: Any = None, loss: Any = None) -> None:
    """End the current step here (`StepTracker.explicit_step`). An argument that is not what
    `ddpviz.step` takes is said once and left out (the step still counts)."""
    tracker = s.tracker
    n = s.guard("ddpviz.step samples", _samples, samples)
    value = s.guard("ddpviz.step loss", _loss, loss)
    first, before = not tracker.explicit, tracker.step
    s.guard("steps", tracker.explicit_step, n, value)
    if first and before > 0:
        s.note(f"rank {s.rank}: steps 0-{before - 1} ended at optimizer steps, later ones at ddpviz.step(); "
               "to count every step with ddpviz.step(), call ddpviz.watch(..., steps='explicit') before the loop",
               level="info")


def flush(s: Session) -> None:
    """Emit `run_started` if it is due (rank 0, a step done or a DDP watched) and write every
    buffered event to this process's spool file now."""
    if s.tracker is not None:
        s.guard("steps", s.tracker.send_steps)
    if s.started is not None:
        s.guard("run_started", s.started.at_exit)
    flush_sink = getattr(s.sink, "flush", None)
    if flush_sink is not None:
        s.guard("events", flush_sink)


def _samples(samples: Any) -> int | None:
    if samples is None:
        return None
    if isinstance(samples, bool):
        raise TypeError("samples must be an int (this rank's samples in the step), not a bool")
    n = operator.index(samples)
    if n < 0:
        raise ValueError(f"samples must be >= 0, got {n}")
    return n


def _loss(loss: Any) -> float | torch.Tensor | None:
    if loss is None:
        return None
    if isinstance(loss, torch.Tensor):
        if loss.numel() != 1:
            raise ValueError(f"loss must be a float or a one-element tensor, got shape {tuple(loss.shape)}")
        return loss.detach()  # read when the step's event is written, as the tracker's own losses
    if isinstance(loss, numbers.Real):
        return float(loss)
    raise TypeError(f"loss must be a float or a one-element tensor, not {type(loss).__name__}")


def as_list(obj: Any, kind: type) -> list[Any]:
    """`obj` as a list of `kind` (one, or an iterable of them; None: none).

    Raises:
        TypeError: something else.
    """
    if obj is None:
        return []
    if isinstance(obj, kind):
        return [obj]
    if isinstance(obj, Iterable) and not isinstance(obj, (str, bytes, torch.Tensor)):
        items = list(obj)
        if all(isinstance(o, kind) for o in items):
            return items
    raise TypeError(f"expected a {kind.__module__}.{kind.__qualname__} or a list of them, "
                    f"got {type(obj).__name__}")
