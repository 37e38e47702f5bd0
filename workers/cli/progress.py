"""Terminal progress for a run, fed by its events (`train` locally, `submit --wait` via Redis)."""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm


class RunProgress:
    """A tqdm bar advanced by a run's ``step`` events (rank 0 only, so DDP counts each step
    once), showing loss and throughput. Hidden when stderr is not a terminal.

    Args:
        total_steps: the run's `steps`.
        desc: the bar's label (e.g. the run id or "DDP").
        position: line of the bar when several are shown.
    """

    def __init__(self, total_steps: int, desc: str, position: int = 0):
        self.bar = tqdm(total=total_steps, desc=desc, position=position, unit="step",
                        dynamic_ncols=True, leave=True, file=sys.stderr, disable=None)
        self.finished: dict[str, Any] | None = None  # the run_finished event, once seen

    def on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "step" and event.get("rank", 0) in (0, None):
            done = int(event.get("step", 0)) + 1
            if done > self.bar.n:
                self.bar.update(done - self.bar.n)
            postfix = {}
            if event.get("loss") is not None:
                postfix["loss"] = f"{event['loss']:.4f}"
            if event.get("samples_per_s") is not None:
                postfix["samples/s"] = f"{event['samples_per_s']:.0f}"
            self.bar.set_postfix(postfix, refresh=False)
        elif kind == "run_finished":
            self.finished = event

    def close(self) -> None:
        self.bar.close()


def _num(value: Any, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, (int, float)) else "-"


def summary_line(run_id: str, status: str, summary: dict[str, Any] | None,
                 error: dict[str, Any] | None = None, mode: str | None = None) -> str:
    """One line: status, steps, throughput, step time, final loss, accuracy, wall time; and the
    error's exception when there is one, with where it happened (`engine.stages.where_failed`:
    ``error (pre-flight): ...``, ``error (rank 1 at step 2): ...``)."""
    from ddpviz.engine.stages import where_failed

    s = summary or {}
    line = (f"run {run_id} {status}: {s.get('steps_done', '-')} steps, "
            f"{_num(s.get('samples_per_s'), '.0f')} samples/s, "
            f"step {_num((s.get('step_time_s') or 0) * 1e3 if s.get('step_time_s') is not None else None, '.1f')} ms, "
            f"final loss {s.get('final_loss_nonfinite') or _num(s.get('final_loss'), '.4f')}, "
            f"val acc {_num(s.get('val_accuracy'), '.3f')}, "
            f"wall {_num(s.get('wall_time_s'), '.1f')} s")
    if error and error.get("exception"):
        where = where_failed(error, mode)
        line += f"\n  error{f' ({where})' if where else ''}: {error['exception']}"
    return line
