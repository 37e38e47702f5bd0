"""Entry point of the engine: run one job and report it through a sink.

`run_training` emits `run_started` first and `run_finished` last, whatever happens, and returns a
`RunResult`. It never raises for a training failure: a crash becomes status `failed` with the
failing rank, the exception and its traceback.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from engine.config import RunConfig
from engine.events import EventSink

Status = Literal["succeeded", "failed", "canceled"]


@dataclass
class RunResult:
    """Outcome of one run. `error` is ``{rank, exception, traceback}`` when status is failed."""

    status: Status
    error: dict[str, Any] | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    final_params: Any = None  # torch.Tensor (P,) on CPU: the trained parameters, for comparisons


def run_training(cfg: RunConfig, sink: EventSink, run_id: str, *,
                 should_stop: Callable[[], bool] | None = None,
                 workdir: str | Path | None = None, node: Any = None) -> RunResult:
    """Run `cfg` here (one process for single/DP, one spawned process per rank for DDP).

    Args:
        cfg: a validated RunConfig.
        sink: receives every event of the run; not closed here.
        run_id: carried in every event.
        should_stop: polled a few times a second; returning True cancels the run (every rank
            process is stopped) and the result has status ``canceled``.
        workdir: scratch folder for rank event files; a temporary one when None.
        node: `engine.launcher.NodeSpec` — this host's part of a multi-host DDP run (nnodes > 1).
            Every node emits run_started/run_finished for its own ranks; the caller merges them.
    """
    from engine.runner import execute

    return execute(cfg, sink, run_id, should_stop=should_stop, workdir=workdir, node=node)
