"""The environment `ddpviz run` (and `ddpviz tune`'s trials) give the command they start: the
caller's, plus what the attach start-up hook reads (`engine.attach.env`) and torchrun's error file.

No secret goes in: no Redis URL (the ranks never talk to Redis; `engine.attach.env.child_environment`), and
the command line it carries has its secrets' values replaced (`redacted`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ddpviz.workers.attached import is_torchrun



# Words that make an argument's name a secret's (`redacted`), as whole words of the name: --api-token X,
# --wandb-key=X, HF_TOKEN=X (not --tokenizer, --keep)
SECRET_WORDS = frozenset({"token", "key", "apikey", "secret", "password", "passwd", "pwd", "auth", "authorization",
                          "credential", "credentials"})
REDACTED = "***"


def _secret_name(name: str) -> bool:
    return any(w in SECRET_WORDS for w in re.split(r"[^a-z0-9]+", name.lower()))


# a URL's password (``scheme://user:PASSWORD@host``), wherever an argument holds one
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)[^@/\s]*@")


def redacted(cmd: list[str]) -> list[str]:
    """`cmd` as ddpviz stores and shows it (the run record, `run_started`, the spool's meta.json, the
    command's environment): the value of every option whose name has one of `SECRET_WORDS` as a word
    (``--api-token X`` and ``--api-token=X``; not a next argument that is itself an option), of every
    ``NAME=VALUE`` argument whose NAME does (``WANDB_API_KEY=X``), and the password of every URL
    (``https://alice:***@host``: a new user's ``--url https://alice:S3cretPw@...`` was stored whole, 2026-12-06)
    replaced by ``***``. The command itself runs with its arguments as given."""
    return [_URL_PASSWORD.sub(rf"\g<head>{REDACTED}@", arg) for arg in _named_secrets(cmd)]


def _named_secrets(cmd: list[str]) -> list[str]:
    out: list[str] = []
    hide = False
    for arg in cmd:
        if hide and not arg.startswith("-"):
            out.append(REDACTED)
            hide = False
            continue
        hide = False
        name, eq, _ = arg.partition("=")
        if eq and _secret_name(name):
            out.append(f"{name}={REDACTED}")
        elif arg.startswith("-") and _secret_name(arg):
            out.append(arg)
            hide = True
        else:
            out.append(arg)
    return out


def command_env(run_id: str, spool: Path, cmd: list[str], probe: bool = False,
                bucket_timing: str = "auto") -> dict[str, str]:
    """os.environ for `cmd` of run `run_id`, its events spooled in `spool`; `probe`: the all-reduce
    probe after the last step; `bucket_timing`: "auto", "hook" or "recorder" (with the flight recorder's
    variables, `engine.attach.env.set_bucket_timing`).

    Raises:
        ValueError: an unknown `bucket_timing` (`set_bucket_timing`).
    """
    from ddpviz.engine.attach.env import (COMMAND_ENV, LAUNCHER_ENV, PROBE_ENV, SOLO_ENV, child_environment,
                                          set_bucket_timing)

    env = child_environment(os.environ, run_id, spool)
    env[LAUNCHER_ENV] = str(os.getpid())  # which processes are this launcher's (`launchers_processes`)
    env[COMMAND_ENV] = json.dumps(redacted(cmd))  # what run_started records: no secret (`redacted`)
    env["TORCHELASTIC_ERROR_FILE"] = str(spool / "error.json")
    if probe:
        env[PROBE_ENV] = "1"
    set_bucket_timing(env, bucket_timing)  # recorder: the flight recorder's variables too
    if not is_torchrun(cmd):
        env[SOLO_ENV] = str(os.getpid())
    return env


def launchers_processes(launcher_pid: int) -> list[int]:
    """Pids of this user's processes whose environment names launcher `launcher_pid` (`LAUNCHER_ENV`, set by
    `command_env`: every process the command started, instrumented or not; not another node's launcher's,
    which shares the run id under ``--join``; Linux /proc)."""
    from ddpviz.engine.attach.env import LAUNCHER_ENV

    mark = f"{LAUNCHER_ENV}={launcher_pid}".encode()
    out = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if mark in (entry / "environ").read_bytes().split(b"\0"):
                out.append(int(entry.name))
        except (ValueError, OSError):
            continue
    return out
