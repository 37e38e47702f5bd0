"""The environment an attached run's processes carry (set by `ddpviz run`, read by the startup hook).

No torch, no Redis: the launcher (`workers.cli.attach`) imports this to build the child's
environment, and `startup/sitecustomize.py` imports it in every Python process the command starts.

A process is instrumented when it carries `RUN_ID_ENV` and either torchrun's worker variables
(RANK, LOCAL_RANK, WORLD_SIZE: torch.distributed.elastic sets them for each worker it starts,
never for itself) or is the launcher's own child while `SOLO_ENV` names the launcher
(``ddpviz run -- python train.py``: that child is the training process; the launcher leaves
`SOLO_ENV` out when the command is torchrun, whose agent process trains nothing).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

RUN_ID_ENV = "DDPVIZ_ATTACH_RUN_ID"  # the run the events belong to
SPOOL_ENV = "DDPVIZ_ATTACH_SPOOL"  # folder each process writes its events into (the launcher forwards them)
URL_ENV = "DDPVIZ_ATTACH_URL"  # the Redis URL the launcher sends them to (for reference; processes never connect)
SOLO_ENV = "DDPVIZ_ATTACH_PARENT_PID"  # the launcher's pid, set when its child is itself the training process
PROBE_ENV = "DDPVIZ_ATTACH_PROBE"  # "1" (`ddpviz run --probe`): the all-reduce probe after the last step
COMMAND_ENV = "DDPVIZ_ATTACH_COMMAND"  # JSON list: the command line `ddpviz run` started
OFF_ENV = "DDPVIZ_ATTACH_OFF"  # "1": the hook does nothing (a user's escape hatch)
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
# How often the launcher forwards the spool files to Redis; a process's event file is flushed as
# often (flushing more often would make no event reach Redis sooner, and each flush takes the GIL
# from the script's training thread).
PUMP_INTERVAL_S = 0.1
STARTUP_DIR = Path(__file__).resolve().parent / "startup"  # holds sitecustomize.py, first on PYTHONPATH


def should_instrument(env: Mapping[str, str] | None = None, parent_pid: int | None = None) -> bool:
    """True in a process the launcher means to instrument (see the module docstring)."""
    env = os.environ if env is None else env
    if not env.get(RUN_ID_ENV) or not env.get(SPOOL_ENV) or env.get(OFF_ENV) == "1":
        return False
    if all(env.get(v) for v in TORCHRUN_VARS):
        return True
    return env.get(SOLO_ENV) == str(os.getppid() if parent_pid is None else parent_pid)


def child_environment(base: Mapping[str, str], run_id: str, spool: Path, url: str | None,
                      package_root: Path) -> dict[str, str]:
    """The environment for the user's command: `base` plus the run's variables, the startup
    folder first on PYTHONPATH and the folder holding ddpviz's packages last (so a user's own
    module named like one of them still wins)."""
    env = dict(base)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    parts = [str(STARTUP_DIR)] + [p for p in parts if p != str(STARTUP_DIR)]
    if str(package_root) not in parts:
        parts.append(str(package_root))
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env[RUN_ID_ENV], env[SPOOL_ENV] = run_id, str(spool)
    if url:
        env[URL_ENV] = url
    return env
