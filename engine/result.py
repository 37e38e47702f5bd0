"""`RunResult`: how one run ended. Imports no torch.

Its own module so that `engine.run` (the entry point) and `engine.runner` (what it calls) both
use it without importing each other (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["succeeded", "failed", "canceled"]


@dataclass
class RunResult:
    """Outcome of one run. `error` is ``{stage, rank, step, exception, traceback}`` when status is
    failed (`engine.stages`)."""

    status: Status
    error: dict[str, Any] | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    final_params: Any = None  # torch.Tensor (P,) on CPU: the trained parameters, for comparisons
