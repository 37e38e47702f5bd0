"""ddpviz from your own training script: `watch` and `step`.

``ddpviz run -- torchrun --nproc-per-node 2 train.py`` records a script that knows nothing of
ddpviz (README, "Watch the training you already run"). This package is for scripts that want to say
more than the start-up hook can find out itself::

    import ddpviz

    with ddpviz.watch(model, optimizer, name="resnet, bucket 50 MiB"):
        for x, y in loader:
            ...
            ddpviz.step(samples=len(x), loss=loss)   # only where optimizer steps are not the steps

    # record it:  ddpviz run -- torchrun --nproc-per-node 2 train.py

Both functions fail open. In a process `ddpviz run` did not start (no run in the environment) they
do nothing but say once, on stderr, that nothing is recorded and how to record it; they never
raise and cost a dictionary lookup a call. In a recorded process an error inside ddpviz switches
that part off, is said once, and training goes on (`engine.attach.session.Session.guard`).

Modules: this one; `integrations` (callbacks for the Hugging Face Trainer and PyTorch Lightning,
imported only where you use them). The work is done by `engine.attach` (`engine.attach.api`).
"""

from __future__ import annotations

import os
import sys
from typing import Any


__all__ = ["watch", "step", "Watched"]

# A source checkout on sys.path with nothing installed (`scripts/gpu_check.sh` on a GPU host's own Python): the
# folders that pyproject's package-dir installs as ddpviz.app, ddpviz.engine and ddpviz.workers sit beside this
# one, so they are found there. An installed ddpviz (no pyproject.toml beside its folder) is left as it is.
_checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isfile(os.path.join(_checkout, "pyproject.toml")) and _checkout not in __path__:
    __path__.append(_checkout)

STEP_RULES = ("optimizer", "explicit")
_session: Any = None  # the process's engine.attach.session.Session, False when not recording, None: not asked yet


class Watched:
    """What `watch` returns; also a context manager (``with ddpviz.watch(model): ...``).

    Attributes:
        recording: True when this process's run is recorded (started by ``ddpviz run``).
        run_id: the run's id (16 hex digits), or None when not recording.
        rank: this process's rank in the run, or None when not recording.
    """

    def __init__(self, session: Any):
        self._s = session or None
        self.recording = self._s is not None
        self.run_id = self._s.run_id if self._s else None
        self.rank = self._s.rank if self._s else None

    def flush(self) -> None:
        """Write every event recorded so far to the run's spool now (and `run_started`, if due),
        so ``ddpviz run`` can send it; never raises. Leaving the ``with`` block does this."""
        if self._s is None:
            return
        try:
            from ddpviz.engine.attach.api import flush

            flush(self._s)
        except Exception:  # fail open
            pass

    def __enter__(self) -> "Watched":
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.flush()
        return False  # an exception of the script's goes on as it would without ddpviz

    def __repr__(self) -> str:
        return f"Watched(recording={self.recording}, run_id={self.run_id!r}, rank={self.rank})"


def watch(model: Any, optimizer: Any = None, name: str | None = None, *, steps: str = "optimizer") -> Watched:
    """Record this process's training in the ``ddpviz run`` it was started by.

    Makes sure the instrumentation is installed (the start-up hook installs it in every training
    process ``ddpviz run`` starts; a process it reaches only through the environment, e.g. behind a
    shell script or via ``torch.multiprocessing.spawn``, is installed here: call `watch` after
    ``init_process_group`` there, so its rank comes from the process group) and registers:

    - `model`: an ``nn.Module`` or a list of them. A ``DistributedDataParallel`` built after the
      instrumentation is watched anyway (bucket timing, no_sync micro-steps); one built before
      (a late install) is watched from now on. Any other module (one device, ``nn.DataParallel``,
      FSDP2) gets its forward time and samples (the leading dimension of the first tensor its
      forward receives) recorded, which a process without DDP otherwise does not have. The first
      model's class and parameter count go into ``run_started``.
    - `optimizer`: a ``torch.optim.Optimizer`` or a list; its state is counted in the memory
      ledger from the first traced step on.
    - `name`: the run's label in the app (rank 0's; ``ddpviz run --name`` wins when given).
    - `steps`: where a step ends in this process. ``"optimizer"`` (default): at each optimizer
      step after a backward, until the first `step` call; ``"explicit"``: only at `step` calls,
      from the first step on (use it with several optimizers per iteration, see `step`).

    Returns:
        `Watched` (``recording`` says whether anything is recorded). As a context manager its
        exit writes what was recorded to the spool (`Watched.flush`); the instrumentation itself
        stays for the rest of the process (the process is the run).

    Fail open: never raises. Not started by ``ddpviz run``: a no-op that says once on stderr
    (rank 0 only) that nothing is recorded and how to record. A wrong argument in a recorded run
    is said once and left out.
    """
    s = _recording()
    if not s:
        return Watched(None)
    try:
        from ddpviz.engine.attach import api

        if steps not in STEP_RULES:
            s.note(f"ddpviz.watch: steps must be one of {STEP_RULES}, got {steps!r}; using 'optimizer'")
        elif steps == "explicit":
            s.tracker.use_explicit_steps()
        if name is not None and s.label is None:
            s.label = str(name)
        import torch

        for m in s.guard("ddpviz.watch model", api.as_list, model, torch.nn.Module) or []:
            s.guard("ddp", api.watch_model, s, m)
        for o in s.guard("ddpviz.watch optimizer", api.as_list, optimizer, torch.optim.Optimizer) or []:
            s.guard("memory", api.watch_optimizer, s, o)
    except Exception as exc:  # fail open
        s.note(f"ddpviz.watch failed ({type(exc).__name__}: {exc}); training goes on")
    return Watched(s)


def step(samples: int | None = None, loss: Any = None) -> None:
    """Mark the end of one training step in this process (for loops with several optimizers, or none).

    From its first call on, the process's steps end here and nowhere else: optimizer steps only
    add their time to the step's ``optimizer_s``. A first call right after an optimizer step that
    already ended a step (nothing of the next one begun) only switches the rule; with several
    optimizer steps per iteration, call ``watch(..., steps="explicit")`` before the loop so the
    first iteration is one step too (else its optimizer steps count as steps, said once).

    Args:
        samples: the samples this rank processed in the step (an int ≥ 0). The step's
            ``samples`` is this × world size (``samples_source`` says so; every rank is taken to
            process as many). None: counted from the batch each watched module's forward receives.
        loss: the step's loss, a float or a one-element tensor. A tensor is detached now and read
            when the step's event is written, right here: on CUDA that read waits for the loss to
            be computed (as ``loss.item()`` would), so pass a float if the script already has one.
            None: the sum of the scalar tensors ``backward()`` was called on in the step.

    Fail open: never raises. Not started by ``ddpviz run``: does nothing (`watch` says so once).
    A wrong argument in a recorded run is said once and left out; the step still counts.
    """
    s = _session if _session is not None else _recording()
    if not s:
        return
    try:
        from ddpviz.engine.attach.api import step as api_step

        api_step(s, samples, loss)
    except Exception as exc:  # fail open
        s.note(f"ddpviz.step failed ({type(exc).__name__}: {exc}); training goes on")


def _recording() -> Any:
    """The session this process records into (installed now if needed), or False."""
    global _session
    if _session is not None:
        return _session
    # imported here, not at the top: `import ddpviz.app` (the web app) must not load the attach code
    from ddpviz.engine.attach.env import OFF_ENV, RUN_ID_ENV, SPOOL_ENV

    env = os.environ
    if not env.get(RUN_ID_ENV) or not env.get(SPOOL_ENV):
        _session = False
        _say_not_recording()
        return _session
    if env.get(OFF_ENV) == "1":  # the user's switch: silent
        _session = False
        return _session
    try:
        from ddpviz.engine.attach.api import ensure_installed

        _session = ensure_installed()
    except Exception as exc:  # fail open: training goes on unrecorded
        _session = False
        print(f"ddpviz: instrumentation off in this process ({type(exc).__name__}: {exc}); training goes on",
              file=sys.stderr, flush=True)
    return _session


def _say_not_recording() -> None:
    """One line on stderr (rank 0 only): nothing is recorded, and the command that records."""
    env = os.environ
    if env.get("RANK", "0") != "0":
        return
    arg0 = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] not in ("", "-c") else ""
    script = arg0 if arg0.endswith(".py") else "train.py"
    world = env.get("WORLD_SIZE")
    launch = f"torchrun --nproc-per-node {env.get('LOCAL_WORLD_SIZE', world)} {script}" \
        if world and world != "1" else f"python {script}"
    print(f"ddpviz: nothing is recorded (this process was not started by `ddpviz run`); "
          f"to record it: ddpviz run -- {launch}", file=sys.stderr, flush=True)
