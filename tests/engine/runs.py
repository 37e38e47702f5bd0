"""One in-process training run for the engine tests: `train(cfg)` -> (RunResult, ListSink)."""

from __future__ import annotations

from typing import Any

from ddpviz.engine.config import RunConfig, validate_config
from ddpviz.engine.events import ListSink
from ddpviz.engine.run import run_training


def train(cfg: RunConfig | dict[str, Any], run_id: str = "test", must_succeed: bool = True) -> tuple:
    """Run `cfg` (a RunConfig, or fields checked by `validate_config`) to its end in this process,
    its events kept in a ListSink. With `must_succeed`, a run that did not succeed fails the test
    with the run's own error."""
    sink = ListSink()
    result = run_training(cfg if isinstance(cfg, RunConfig) else validate_config(cfg), sink, run_id)
    if must_succeed:
        assert result.status == "succeeded", result.error
    return result, sink
