"""The failing rank's exception, where torchrun looks for it.

torch.distributed.elastic gives each worker its own `TORCHELASTIC_ERROR_FILE`; a worker whose
main is decorated with `@record` writes its uncaught exception there, and torchrun (itself
`@record`) copies the first failure's file to its own `TORCHELASTIC_ERROR_FILE`
(torch/distributed/elastic/multiprocessing/errors). A user's script is rarely decorated, so
`install_excepthook` writes the same file from `sys.excepthook`, in the same JSON shape
(`ErrorHandler.record_exception`), with the rank added under ``extraInfo``; `ddpviz run` reads it.

Only the ranks install the hook (`engine.attach.claim`: no helper or DataLoader worker), and an
exception raised in ddpviz's own code (its innermost frame in the `ddpviz` package) is never
written there: torchrun's error file names the script's failure, not ours.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

_OURS = Path(__file__).resolve().parents[1]  # the folder installed as ddpviz.engine


# each failing rank's payload, also in the run's spool (`install_excepthook`'s `spool`): torchrun copies the
# failure with the smallest `timestamp`, in whole seconds, the lowest rank on a tie (ChildFailedError.
# get_first_failure), so a rank 0 that failed in the same second because rank 1 died was named the root cause;
# `ddpviz run` takes the earliest of these by `time_ns` (workers.attached.failure)
RANK_ERROR_FILE = "error-rank{rank}.json"


def write_private(path: Path, doc: Any) -> None:
    """`doc` as JSON in `path`, made 0600 (the spool's files are the user's alone: docs/attach.md) and replaced
    whole (written to a ``.tmp`` beside it first): a reader sees the old file or the new one. The spool's one
    writer of such files (`workers.spool` too)."""
    tmp = path.with_suffix(".tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
        json.dump(doc, fh)
    os.replace(tmp, path)


def error_payload(exc: BaseException, rank: int) -> dict:
    """The error file's JSON: ``{"message": {"message", "extraInfo": {py_callstack, timestamp, rank, time_ns}}}``
    (`timestamp` whole seconds as torch writes and parses it; `time_ns` ddpviz's, which torch ignores)."""
    now_ns = time.time_ns()
    return {"message": {"message": f"{type(exc).__name__}: {exc}",
                        "extraInfo": {"py_callstack": "".join(traceback.format_exception(exc)),
                                      "timestamp": str(now_ns // 10**9), "rank": rank, "time_ns": now_ns}}}


def raised_in_ddpviz(tb) -> bool:
    """Whether the innermost frame of traceback `tb` is in ddpviz's own code (`ddpviz.engine`)."""
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and _is_ours(last)


def _is_ours(tb) -> bool:
    try:
        return Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(_OURS)
    except (OSError, ValueError):
        return False


def without_own_frames(tb):
    """Traceback `tb` with ddpviz's own frames (`ddpviz.engine`: the wrappers a script's backward or comm hook runs
    through when attached) unlinked, so a script's traceback reads as without ddpviz (a new user's Ctrl-C showed
    `engine/attach/__init__.py ... in timed_backward`, 2026-12-06). Kept whole when its innermost frame is ddpviz's
    (`raised_in_ddpviz`: ddpviz's own error shows where it is). Relinks `tb_next` in place (writable since
    Python 3.7); returns the first kept entry."""
    if tb is None or raised_in_ddpviz(tb):
        return tb
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    kept = [t for t in entries if not _is_ours(t)]  # never empty: the innermost frame is not ddpviz's
    for a, b in zip(kept, kept[1:]):
        a.tb_next = b
    return kept[0]


def child_failure(exc: BaseException) -> dict | None:
    """The error file's JSON for a launcher's `ChildFailedError`
    (torch.distributed.elastic.multiprocessing.errors: `get_first_failure()` gives the first
    failing rank and its `ProcessFailure`, whose `error_file_data` is that worker's own error file):
    that rank's exception, not the launcher's. None for any other exception."""
    get = getattr(exc, "get_first_failure", None)
    if get is None or not callable(get):
        return None
    rank, failure = get()
    data = getattr(failure, "error_file_data", None)
    msg = data.get("message") if isinstance(data, dict) else None
    if isinstance(msg, dict):
        return {"message": {**msg, "extraInfo": {**(msg.get("extraInfo") or {}), "rank": rank}}}
    text = getattr(failure, "message", None) or f"rank {rank} exited with code {getattr(failure, 'exitcode', None)}"
    return {"message": {"message": text, "extraInfo": {"py_callstack": None, "rank": rank,
                                                       "timestamp": str(int(time.time()))}}}


def install_excepthook(rank: int | None | Callable[[], int | None], spool: Path | None = None) -> Callable[[], None]:
    """Write an uncaught exception to this worker's `TORCHELASTIC_ERROR_FILE` (unless something,
    e.g. `@record`, wrote one already, or the exception is ddpviz's own: `raised_in_ddpviz`),
    then call the previous hook. `rank`: the rank, or a callable giving it when the hook runs
    (None: a process that trained nothing, e.g. `accelerate launch` itself). A launcher's
    `ChildFailedError` is written as its first failing rank's exception (`child_failure`).
    A rank's own exception also goes to `spool`/`RANK_ERROR_FILE` (when given), with its `time_ns`. What is
    printed and written leaves ddpviz's wrapper frames out (`without_own_frames`). Every exception but a
    `SystemExit` counts (a rank's own `KeyboardInterrupt` was left out, and the peer it left waiting was blamed).

    Returns the at-exit half, for the process's atexit: a script that replaced `sys.excepthook` after ddpviz
    (its own crash reporter) bypasses the hook, but Python still sets `sys.last_value` before calling the
    script's hook, so the exception is recorded then (a new user's run read "exited with code 1, without an
    exception", 2026-12-06)."""
    previous = sys.excepthook
    recorded: list[BaseException] = []

    def record(exc: BaseException, tb) -> None:
        if isinstance(exc, (SystemExit, GeneratorExit)) or raised_in_ddpviz(tb) or any(e is exc for e in recorded):
            return
        recorded.append(exc)
        r = rank() if callable(rank) else rank
        launcher = child_failure(exc)
        payload = launcher or error_payload(exc.with_traceback(tb), r)
        path = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if path and not os.path.exists(path):
            with open(path, "w") as fh:
                json.dump(payload, fh)
        if spool is not None and launcher is None and r is not None:  # 0600, as the spool's other files
            write_private(spool / RANK_ERROR_FILE.format(rank=r), payload)

    def hook(exc_type, exc, tb):
        try:  # the script's frames only, in what is printed and what the error files hold
            seen, e = set(), exc
            while e is not None and id(e) not in seen:  # the exception and those chained to it
                seen.add(id(e))
                e.__traceback__ = without_own_frames(tb if e is exc else e.__traceback__)
                e = e.__cause__ or e.__context__
            tb = exc.__traceback__
        except Exception:
            pass
        try:
            record(exc, tb)
        except Exception:
            pass
        previous(exc_type, exc, tb)

    def at_exit() -> None:
        exc = getattr(sys, "last_value", None)  # set by Python before it calls whatever sys.excepthook is then
        if isinstance(exc, BaseException) and sys.excepthook is not hook:
            record(exc, without_own_frames(exc.__traceback__))

    sys.excepthook = hook
    return at_exit


# the exit code of every rank that failed, as torchrun's ChildFailedError knows it ({"failures": {rank: {exitcode,
# time_ns}}}): written by the command's own top process (torchrun) when it ends on that error. torchrun exits 1
# whatever its workers' codes were (a rank's sys.exit(3) or argparse's exit 2), and a rank that exits without an
# exception leaves no error file: this is the only place its own code survives (workers.attached.failure)
RANK_EXITS_FILE = "rank-exits.json"
# when a rank's Python exited (its atexit: after sys.exit, argparse's exit, the script's end or an uncaught exception),
# so a rank's own exit orders against the other ranks' exceptions it caused (`workers.attached.failure`)
RANK_EXIT_TIME_FILE = "exit-rank{rank}.json"


def note_exit(spool: Path, rank: int) -> None:
    """Write `spool`/`RANK_EXIT_TIME_FILE` for `rank` ({"time_ns": now}, 0600); from the rank's atexit."""
    write_private(spool / RANK_EXIT_TIME_FILE.format(rank=rank), {"time_ns": time.time_ns()})


def install_launcher_hook(spool: Path) -> None:
    """In the command's top process (torchrun, `engine.attach.claim.wait_for_process_group`): on an uncaught
    `ChildFailedError` (duck-typed: `failures`, a {rank: ProcessFailure} dict, with `exitcode` and `timestamp`),
    write each failed rank's exit code to `spool`/`RANK_EXITS_FILE` (0600), then call the previous hook. Imports
    nothing; any error of its own is ignored."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        try:
            failures = getattr(exc, "failures", None)
            if isinstance(failures, dict) and failures:
                doc = {"failures": {str(rank): {"exitcode": getattr(f, "exitcode", None),
                                                "timestamp": getattr(f, "timestamp", None)}
                                    for rank, f in failures.items()}}
                write_private(spool / RANK_EXITS_FILE, doc)
        except Exception:
            pass
        previous(exc_type, exc, tb)

    sys.excepthook = hook
