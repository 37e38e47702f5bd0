"""The environment an attached run's processes carry (set by `ddpviz run`, read by the startup hook).

No torch, no Redis: the launcher (`workers.cli.attach`) imports this to build the child's
environment, and `startup/sitecustomize.py` imports it in every Python process the command starts.

Who is instrumented (`process_role`): only the training processes, whoever starts them.

- "rank": a process with the run's variables that is a torchrun worker (RANK, LOCAL_RANK,
  WORLD_SIZE: torch.distributed.elastic sets them for each worker it starts, never for itself) or
  the launcher's own child while `SOLO_ENV` names the launcher (``ddpviz run -- python train.py``:
  its rank 0 under Lightning's or `torch.multiprocessing.spawn`'s launcher; `accelerate launch`,
  which trains nothing itself). It marks itself (`RANK_PID_ENV`, inherited by every process it
  starts), installs the instrumentation once the script imports torch, and writes an event file
  only once it trains (`engine.attach.session`).
- "dormant": every other process of the command (torchrun's agent, a helper subprocess, DataLoader
  workers, compile workers, the ranks `accelerate launch` or Lightning start): nothing is imported,
  patched or written, unless it initialises a process group of its own
  (`torch.distributed.init_process_group`): then it is a rank and instruments itself
  (`engine.attach.claim`).
- "off": not a process of an attached run, or `OFF_ENV` is "1".
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

RUN_ID_ENV = "DDPVIZ_ATTACH_RUN_ID"  # the run the events belong to
SPOOL_ENV = "DDPVIZ_ATTACH_SPOOL"  # folder each process writes its events into (the launcher forwards them)
SOLO_ENV = "DDPVIZ_ATTACH_PARENT_PID"  # the launcher's pid, set when its child is itself the training process
PROBE_ENV = "DDPVIZ_ATTACH_PROBE"  # "1" (`ddpviz run --probe`): the all-reduce probe after the last step
COMMAND_ENV = "DDPVIZ_ATTACH_COMMAND"  # JSON list: the command line `ddpviz run` started
OFF_ENV = "DDPVIZ_ATTACH_OFF"  # "1": the hook does nothing (a user's escape hatch)
RANK_PID_ENV = "DDPVIZ_ATTACH_RANK_PID"  # pid of the nearest process that is (or may become) a rank
LAUNCHER_ENV = "DDPVIZ_ATTACH_LAUNCHER"  # pid of the `ddpviz run` that started the command (who to stop)
BUCKET_TIMING_ENV = "DDPVIZ_ATTACH_BUCKET_TIMING"  # `ddpviz run --bucket-timing`: "auto", "hook" (unset), "recorder"
# NCCL flight-recorder entries `ddpviz run --bucket-timing recorder` asks for (two steps of up to 64
# buckets, `engine.modes.ddp.flight.buffer_entries`): the DDP is not built yet when the command starts;
# more buckets a step need a larger TORCH_FR_BUFFER_SIZE, which the user's own setting gives
ATTACH_FR_BUCKETS = 64
# Kineto (torch 2.13's CPU build) prints "USDT:... SyncActivityProfilerHandler.cpp:52] profiler_start" and
# "...profiler_stop" on stderr at every profile, at any KINETO_LOG_LEVEL below 6, which it reads once, at torch's
# import. The recorder path profiles its sampled steps on gloo (`engine.modes.ddp.sampled`): ~40 such lines a run
# in the script's own output, which it never prints without ddpviz (found 2026-12-06). 6 silences Kineto's
# messages in the script's processes; a level the user set is kept.
KINETO_LOG_ENV = "KINETO_LOG_LEVEL"
KINETO_QUIET = "6"
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
# How often the launcher forwards the spool files to Redis; a process's event file is flushed as
# often (flushing more often would make no event reach Redis sooner, and each flush takes the GIL
# from the script's training thread).
PUMP_INTERVAL_S = 0.1
STARTUP_DIR = Path(__file__).resolve().parent / "startup"  # holds sitecustomize.py, first on PYTHONPATH


def process_role(env: Mapping[str, str] | None = None, parent_pid: int | None = None) -> str:
    """"rank", "dormant" or "off" for a process with `env` whose parent is `parent_pid` (default:
    this process); see the module docstring."""
    env = os.environ if env is None else env
    if not env.get(RUN_ID_ENV) or not env.get(SPOOL_ENV) or env.get(OFF_ENV) == "1":
        return "off"
    if env.get(RANK_PID_ENV):  # a descendant of a rank: a helper, a DataLoader worker, a launched rank
        return "dormant"
    if all(env.get(v) for v in TORCHRUN_VARS):
        return "rank"
    if env.get(SOLO_ENV) == str(os.getppid() if parent_pid is None else parent_pid):
        return "rank"
    return "dormant"


def should_instrument(env: Mapping[str, str] | None = None, parent_pid: int | None = None) -> bool:
    """True in a process that is a rank from its start (`process_role` "rank")."""
    return process_role(env, parent_pid) == "rank"


_OURS = (RUN_ID_ENV, SPOOL_ENV, SOLO_ENV, PROBE_ENV, COMMAND_ENV, RANK_PID_ENV, LAUNCHER_ENV, BUCKET_TIMING_ENV,
         "DDPVIZ_ATTACH_URL")


def child_environment(base: Mapping[str, str], run_id: str, spool: Path) -> dict[str, str]:
    """The environment for the user's command: `base` without any attached run's variables it
    carried, plus this run's, and the startup folder first on PYTHONPATH (it holds
    sitecustomize.py alone). Nothing else goes on the path: `ddpviz` is importable in the same
    interpreter through its installation (a regular or editable install), and a user's own
    `engine`, `app`, `workers` must win. No secret goes in (the Redis URL stays with the launcher)."""
    env = {k: v for k, v in base.items() if k not in _OURS}
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    parts = [str(STARTUP_DIR)] + [p for p in parts if p != str(STARTUP_DIR)]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env[RUN_ID_ENV], env[SPOOL_ENV] = run_id, str(spool)
    return env


def bucket_timing(env: Mapping[str, str] | None = None) -> str:
    """This rank's requested `bucket_timing` (`engine.config.BUCKET_TIMING_CHOICES`): `BUCKET_TIMING_ENV`, "hook"
    when unset or not one of them (`ddpviz.watch()` in a script not started by `ddpviz run`: nothing set the
    variables the recorder's sampled steps need). "auto" is resolved per DDP by its backend
    (`engine.attach.nohook.bucket_timing_of`). Called in ranks only (it imports the config's names)."""
    from ddpviz.engine.config import BUCKET_TIMING_CHOICES

    value = (os.environ if env is None else env).get(BUCKET_TIMING_ENV, "")
    return value if value in BUCKET_TIMING_CHOICES else "hook"


def set_bucket_timing(env: dict[str, str], timing: str) -> None:
    """Ask the command's ranks for `timing` ("auto", "hook" or "recorder"; "auto": each DDP's backend picks,
    `engine.config.resolve_bucket_timing`). With "recorder", the flight
    recorder's variables are set too, unless the user set them: on torch 2.13 a process reads its
    buffer size when its process group is made (a size set after `init_process_group` is ignored;
    checked on gloo), so it cannot wait for DDP; TORCH_NCCL_ENABLE_TIMING=1 gives NCCL entries a GPU
    duration and is read by NCCL only. On gloo the recorder holds entries anyway (2,000 by default on
    torch 2.13); a smaller buffer costs it nothing more. `KINETO_LOG_LEVEL` is set to `KINETO_QUIET` unless the
    user set it, so the sampled steps' profiler adds no line to the script's output. "auto" sets only
    `KINETO_LOG_LEVEL` (read at torch's import, before the backend is known): a gloo DDP gets the recorder,
    whose sampled steps run the profiler; an NCCL one the hook, which reads no flight recorder.

    Raises:
        ValueError: `timing` is not one of `engine.config.BUCKET_TIMING_CHOICES`.
    """
    from ddpviz.engine.config import BUCKET_TIMING_CHOICES

    if timing not in BUCKET_TIMING_CHOICES:
        raise ValueError(f"bucket_timing must be one of {', '.join(BUCKET_TIMING_CHOICES)} (got {timing!r})")
    env[BUCKET_TIMING_ENV] = timing
    if timing != "hook":
        env.setdefault(KINETO_LOG_ENV, KINETO_QUIET)  # the sampled steps' profiler prints nothing of its own
    if timing == "recorder":
        from ddpviz.engine.modes.ddp.flight import buffer_entries, enable_recorder

        enable_recorder(buffer_entries(ATTACH_FR_BUCKETS), "nccl", environ=env)
