"""`RunResult`: how one run ended. Imports no torch.

Its own module so that `engine.run` (the entry point) and `engine.runner` (what it calls) both
use it without importing each other (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal


class RunStatus(str, Enum):
    """The one vocabulary of a run's status, everywhere: the engine's `RunResult`, the run record
    (`workers.store`), the `run_finished` event, the pages and the CLI. Lower-case values."""

    QUEUED = "queued"  # stored, waiting for a worker
    STARTED = "started"  # a worker runs it
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"
    LOST = "lost"  # its worker stopped sending heartbeats mid-run (killed, host down)

    @classmethod
    def _missing_(cls, value: object) -> "RunStatus | None":
        # records stored before the vocabulary was one said "succeeded" (RQ's word) for succeeded
        return cls.SUCCEEDED if value == "finished" else None


ACTIVE = (RunStatus.QUEUED, RunStatus.STARTED)
TERMINAL = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELED, RunStatus.LOST)
Status = Literal["succeeded", "failed", "canceled"]  # how the engine itself can end a run


@dataclass
class RunResult:
    """Outcome of one run. `error` is ``{stage, rank, step, exception, traceback}`` when status is
    failed (`engine.stages`)."""

    status: Status
    error: dict[str, Any] | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    final_params: Any = None  # torch.Tensor (P,) on CPU: the trained parameters, for comparisons
