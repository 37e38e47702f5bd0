"""How a process of an attached run becomes an instrumented rank (`engine.attach.env.process_role`),
without importing torch itself.

- A "rank" from its start (a torchrun worker; the launcher's own child) marks itself for its
  descendants (`RANK_PID_ENV`) at once, so the helpers and DataLoader workers it starts are
  dormant, and installs the instrumentation (`engine.attach.install`) right after the script
  first imports torch (`engine.attach.imports.after_import`): a process that never imports torch
  (a shell-like launcher, a helper) never gets it from us.
- A "dormant" process is left alone, but for one wrapper around
  `torch.distributed.init_process_group`, put in place when (if ever) the script imports it: a
  process that initialises a process group of its own is a rank (the workers `accelerate launch`,
  Lightning's subprocess launcher or `torch.multiprocessing.spawn` start); it marks itself and
  installs the instrumentation right after the call, taking its rank and world size from the
  group (`engine.attach.api.ensure_installed`). Helpers, DataLoader and compile workers never
  call it.

Fail open: an error here is said in one line on stderr and the program goes on uninstrumented.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Any

from ddpviz.engine.attach.env import LAUNCHER_ENV, RANK_PID_ENV, SPOOL_ENV
from ddpviz.engine.attach.imports import after_import

C10D = "torch.distributed.distributed_c10d"  # where init_process_group is defined (torch >= 1.8)


def mark_rank() -> None:
    """Name this process as its descendants' rank: they start dormant."""
    os.environ[RANK_PID_ENV] = str(os.getpid())


def _install(why: str, env: dict[str, str] | None = None) -> None:
    try:
        if why == "torch imported":
            from ddpviz.engine.attach import install

            install(env)
        else:
            from ddpviz.engine.attach.api import ensure_installed

            ensure_installed(env)
    except Exception as exc:  # fail open: training goes on uninstrumented
        print(f"ddpviz: instrumentation off in this process ({type(exc).__name__}: {exc})",
              file=sys.stderr, flush=True)


def start_rank() -> None:
    """This process is a rank from its start: mark it, instrument it once torch is imported."""
    mark_rank()
    after_import("torch", lambda module: _install("torch imported"))


def wait_for_process_group() -> None:
    """This process is dormant: it becomes a rank if it initialises a process group. The command's own top
    process (the launcher's child, e.g. torchrun) also keeps its failed ranks' exit codes
    (`engine.attach.errors.install_launcher_hook`)."""
    after_import(C10D, _wrap_init_process_group)
    if os.environ.get(LAUNCHER_ENV) == str(os.getppid()) and os.environ.get(SPOOL_ENV):
        from ddpviz.engine.attach.errors import install_launcher_hook

        install_launcher_hook(Path(os.environ[SPOOL_ENV]))


def _wrap_init_process_group(c10d: Any) -> None:
    try:
        original = c10d.init_process_group
    except AttributeError:
        return
    if getattr(original, "_ddpviz_claims", False):
        return

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if os.environ.get(RANK_PID_ENV) != str(os.getpid()):  # once per process
            mark_rank()
            _install("process group")
        return out

    init_process_group._ddpviz_claims = True  # type: ignore[attr-defined]
    c10d.init_process_group = init_process_group
    package = sys.modules.get("torch.distributed")  # its star import may have copied the original already
    if package is not None and getattr(package, "init_process_group", None) is original:
        package.init_process_group = init_process_group
