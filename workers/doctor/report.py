"""The report of `ddpviz doctor`: one verdict and its figures per check, as JSON and Markdown.

A check's verdict is ``pass``, ``warn`` (it ran and reported its figures, but a target it states
and does not enforce was missed), ``fail`` or ``skip`` (could not run here, with the reason). The
doctor exits non-zero when any check failed; a warning alone leaves the exit code at 0.
`report.json` holds everything; `report.md` is the same as a table a person can paste into the
README's "GPU results".

Each check runs with the process's stop-signal handlers kept (`signals_kept`): torch's elastic
agent, which the GPU checks run in this (the main) thread, installs its own handler for SIGTERM,
SIGINT, SIGHUP and SIGQUIT (`PContext.start` in torch/distributed/elastic/multiprocessing/api.py)
and never puts the old one back, and turns the signal into an exception that ddpviz's launcher
reports as a failed run. So after every check the handlers are restored, and a stop signal that
arrived during the check (seen through `signal.set_wakeup_fd`, whoever handled it) ends the
doctor with `Interrupted`, after which its cleanup check runs.
"""

from __future__ import annotations

import contextlib
import json
import platform
import signal
import socket
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

VERDICTS = ("pass", "warn", "fail", "skip")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)  # torch elastic's set


@dataclass
class Check:
    """One check: `name`, `verdict` (pass|warn|fail|skip), `detail` (a sentence: what was found, and
    for a failure why), `figures` (JSON-able measurements, units in their names), `seconds`."""

    name: str
    verdict: str = "pass"
    detail: str = ""
    figures: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS} (got {self.verdict!r})")


class CheckFailed(Exception):
    """Raised inside a check to fail it with a message (and the figures gathered so far)."""

    def __init__(self, message: str, figures: dict[str, Any] | None = None):
        super().__init__(message)
        self.figures = figures or {}


class CheckWarned(Exception):
    """Raised inside a check that ran but missed a target it reports without enforcing: ``warn``,
    with the message and the figures (not a `CheckFailed`: the doctor's exit code stays 0)."""

    def __init__(self, message: str, figures: dict[str, Any] | None = None):
        super().__init__(message)
        self.figures = figures or {}


class CheckSkipped(Exception):
    """Raised inside a check that cannot run here; the message says why."""


class Interrupted(SystemExit):
    """A stop signal ended the doctor during `check` (recorded as failed); exit code 128 + signal."""

    def __init__(self, check: "Check", code: int):
        super().__init__(code)
        self.check = check


@contextlib.contextmanager
def signals_kept(signals=STOP_SIGNALS):
    """Put back the handlers of `signals` after the block, and say which of them arrived in it.

    Yields a list that, after the block, holds the numbers of those signals delivered during it,
    also ones another handler swallowed (Python writes every handled signal's number to the
    wakeup fd, `signal.set_wakeup_fd`). Outside the main thread (where handlers cannot be set)
    it does nothing.
    """
    seen: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return
    saved = {s: signal.getsignal(s) for s in signals}
    rx, tx = socket.socketpair()
    rx.setblocking(False)
    tx.setblocking(False)
    old_fd = signal.set_wakeup_fd(tx.fileno(), warn_on_full_buffer=False)
    try:
        yield seen
    finally:
        signal.set_wakeup_fd(old_fd)
        for s, handler in saved.items():
            if handler is not None:  # None: set from outside Python; leave it
                signal.signal(s, handler)
        with contextlib.suppress(BlockingIOError):
            seen.extend(n for n in rx.recv(4096) if n in {int(s) for s in signals})
        rx.close()
        tx.close()


def run_check(name: str, fn: Callable[[], tuple[str, dict[str, Any]]],
              log: Callable[[str], None] = print) -> Check:
    """Run `fn` (which returns ``(detail, figures)``) as check `name`, timed.

    `CheckWarned` makes it ``warn`` (with its figures); `CheckFailed` and any other exception make it
    ``fail`` (an unexpected exception keeps its last traceback lines in the figures), `CheckSkipped`
    makes it ``skip``. Stop-signal handlers are the same after the check as before it (`signals_kept`).

    Raises:
        Interrupted: a stop signal arrived during the check (the doctor's own SIGTERM handler's
            `SystemExit`, or a signal some library's handler turned into an exception); the
            check, failed and saying so, rides on it.
    """
    log(f"doctor: {name} ...")
    t0 = time.monotonic()
    stopped: SystemExit | None = None
    with signals_kept() as seen:
        try:
            detail, figures = fn()
            check = Check(name, "pass", detail, figures)
        except CheckSkipped as exc:
            check = Check(name, "skip", str(exc))
        except CheckWarned as exc:
            check = Check(name, "warn", str(exc), exc.figures)
        except CheckFailed as exc:
            check = Check(name, "fail", str(exc), exc.figures)
        except SystemExit as exc:  # the doctor's SIGTERM handler (or a sys.exit inside the check)
            stopped, check = exc, Check(name, "fail", f"stopped: SystemExit({exc.code})")
        except Exception as exc:  # a check must never take the doctor down with a traceback
            tb = traceback.format_exception(exc)
            check = Check(name, "fail", f"{type(exc).__name__}: {exc}", {"traceback_tail": "".join(tb[-3:])})
    check.seconds = round(time.monotonic() - t0, 3)
    if seen and stopped is None:
        sig = signal.Signals(seen[0])
        check.verdict, check.detail = "fail", f"stopped by {sig.name} (a time limit?); it ended as: {check.detail}"
        stopped = SystemExit(128 + sig)
    log(f"doctor: {name}: {check.verdict} ({check.seconds:.1f} s) {check.detail}")
    if stopped is not None:
        raise Interrupted(check, stopped.code if isinstance(stopped.code, int) else 1) from None
    return check


@dataclass
class Report:
    """All checks of one doctor run and where it ran."""

    checks: list[Check] = field(default_factory=list)
    gpu: bool = False
    started_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    host: str = field(default_factory=socket.gethostname)
    platform: dict[str, Any] = field(default_factory=lambda: dict(python=platform.python_version(),
                                                                   system=platform.platform()))

    @property
    def ok(self) -> bool:
        """No check failed (a warning or a skip leaves the report ok)."""
        return all(c.verdict != "fail" for c in self.checks)

    def counts(self) -> dict[str, int]:
        """Checks per verdict, every verdict named (0 where none)."""
        return {v: sum(c.verdict == v for c in self.checks) for v in VERDICTS}

    def headline(self) -> str:
        """'all passed', 'passed with warnings: a, b' or 'FAILED: c', then the checks counted (by verdict
        where not all passed): the doctor's last line and its report's title."""
        named = {v: [c.name for c in self.checks if c.verdict == v] for v in ("fail", "warn")}
        head = ("FAILED: " + ", ".join(named["fail"]) if named["fail"] else
                "passed with warnings: " + ", ".join(named["warn"]) if named["warn"] else "all passed")
        counts = self.counts()
        if counts["pass"] == len(self.checks):
            return f"{head} ({len(self.checks)} checks)"
        return f"{head} ({len(self.checks)} checks: {', '.join(f'{n} {v}' for v, n in counts.items() if n)})"

    autosave_dir: Path | None = None  # when set, the report is rewritten after every check

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        if self.autosave_dir is not None:  # a doctor stopped half-way still leaves what it found
            self.write(self.autosave_dir)
        return check

    def as_dict(self) -> dict[str, Any]:
        return dict(ok=self.ok, verdicts=self.counts(), gpu=self.gpu, started_at=self.started_at, host=self.host,
                    platform=self.platform, checks=[asdict(c) for c in self.checks])

    def write(self, out_dir: str | Path) -> tuple[Path, Path]:
        """Write `out_dir/report.json` and `out_dir/report.md`; returns both paths."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        js, md = out / "report.json", out / "report.md"
        js.write_text(json.dumps(self.as_dict(), indent=2, default=str) + "\n", encoding="utf-8")
        md.write_text(self.markdown(), encoding="utf-8")
        return js, md

    def markdown(self) -> str:
        lines = [f"# ddpviz doctor{' --gpu' if self.gpu else ''}: {self.headline()}",
                 "", f"{self.started_at} on `{self.host}` (Python {self.platform['python']}, "
                 f"{self.platform['system']})", "",
                 "| check | verdict | seconds | what was found |", "|---|---|---:|---|"]
        for c in self.checks:
            lines.append(f"| {c.name} | **{c.verdict}** | {c.seconds:.1f} | {_cell(c.detail)} |")
        for c in self.checks:
            if c.figures:
                lines += ["", f"## {c.name}", "", "```json", json.dumps(c.figures, indent=2, default=str), "```"]
        return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def run_figures(client, rec: dict[str, Any]) -> dict[str, Any]:
    """A finished run's headline figures and its events counted by type."""
    from ddpviz.workers.history import read_all_events

    counts: dict[str, int] = {}
    for e in read_all_events(client, rec["run_id"]):
        counts[e["type"]] = counts.get(e["type"], 0) + 1
    s = rec.get("summary") or {}
    return dict(run_id=rec["run_id"], status=rec["status"], steps_done=s.get("steps_done"),
                samples_per_s=s.get("samples_per_s"), final_loss=s.get("final_loss"),
                wall_time_s=s.get("wall_time_s"), events=counts,
                error=(rec.get("error") or {}).get("exception"))
