"""Entry point of the engine: run one job and report it through a sink.

`run_training` emits `run_started` first and `run_finished` last, whatever happens, and returns a
`RunResult`. It never raises for a training failure: a crash becomes status `failed` with the
stage that failed (`engine.stages`), the failing rank and step, the exception and its traceback.
Importing this module loads no torch; `run_training` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ddpviz.engine.config import RunConfig
from ddpviz.engine.events import EventSink
from ddpviz.engine.result import RunResult, Status

__all__ = ["RunResult", "Status", "run_training"]


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
        node: `engine.modes.launcher.NodeSpec` — this host's part of a multi-host DDP run (nnodes > 1).
            Every node emits run_started/run_finished for its own ranks; the caller merges them.
    """
    from ddpviz.engine.runner import execute

    return execute(cfg, sink, run_id, should_stop=should_stop, workdir=workdir, node=node)
