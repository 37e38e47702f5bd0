"""Where a run failed: the `stage` of a `run_finished` error, and a short phrase for it.

Imports no torch, so the app and the CLI can describe an error. Stages, in the order a run goes
through them (docs/events.md, `run_finished`):

| stage | what was running |
|---|---|
| ``config`` | validating the stored RunConfig (the worker, before the engine) |
| ``dataset`` | loading the dataset (a plugin's `dataset(cfg)`, or a built-in one) |
| ``plugin build`` / ``model build`` | building the model (a plugin's `build(cfg)`, or a built-in one) |
| ``pre-flight`` | devices, the checks on model and data, the bucket preview — before any rank starts |
| ``training`` | a rank (DDP) or the training process (single, DP); `rank` and `step` say where |
"""

from __future__ import annotations

from typing import Any

STAGES = ("config", "dataset", "plugin build", "model build", "pre-flight", "training")


def unit_word(mode: str | None) -> str:
    """What a run's failing unit is called: "device" for DP (threads of one process, one per device), else
    "rank" (DDP's and FSDP's processes); a new user read "rank 0 raised" of a DP run (2026-12-06)."""
    return "device" if mode == "dp" else "rank"


def where_failed(error: dict[str, Any] | None, mode: str | None = None) -> str:
    """A phrase for where `error` happened: ``"pre-flight"``, ``"plugin build"``, ``"rank 1 at
    step 2"`` (``"device 1 at step 2"`` for `mode` dp: DP has devices in one process, no ranks),
    ``"training, step 4"``; ``"rank 0"`` for errors without a stage (older records, the worker's own
    endings); empty when nothing is known."""
    error = error or {}
    stage, rank, step = error.get("stage"), error.get("rank"), error.get("step")
    at = f" at step {step}" if step is not None else ""
    if stage in (None, "training"):
        if rank is not None:
            return f"{unit_word(mode)} {rank}{at}"
        return f"training{at}" if stage else ""
    return str(stage)
