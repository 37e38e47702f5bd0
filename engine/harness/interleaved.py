"""Several ddpviz runs measured side by side in time: all started at once, training in turns.

`run_in_turns` starts every run in a process of its own (DDP runs then start their ranks as
usual) and lets them train `block_steps` steps at a time, one run at a time, the order rotated
each round (`engine.measure.turns`). On this 2-core VM the same loop's step time drifts 30-60% over
seconds; runs measured one after another compare the machine at different moments, runs taking
turns a fraction of a second apart compare the runs. The scale-out predictor's validation uses it
(calibrated on world size 2, checked at 1 and 3: the same machine for all).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from ddpviz.engine.config import RunConfig
from ddpviz.engine.measure.turns import GATE_ENV, TurnController


def _child(cfg_dict: dict, run_id: str, out_path: str) -> None:
    """One run in its own process; its events and status written to `out_path` (JSON)."""
    from ddpviz.engine.events import ListSink
    from ddpviz.engine.run import run_training

    sink = ListSink()
    result = run_training(RunConfig(**cfg_dict), sink, run_id)
    Path(out_path).write_text(json.dumps(dict(status=result.status, error=result.error, events=sink.events),
                                         default=str))


def rotated_order(run_ids: list[str], blocks: int) -> list[str]:
    """Round k runs the runs in order, starting at run k mod len: each run goes first equally often."""
    m = len(run_ids)
    return [run_ids[(k + i) % m] for k in range(blocks) for i in range(m)]


def gate_ranks(cfg: RunConfig) -> int:
    """Processes of a run that pass the turn gate: one per rank for DDP and FSDP, else one."""
    return cfg.world_size if cfg.mode in ("ddp", "fsdp") else 1


def run_in_turns(configs: dict[str, RunConfig], block_steps: int, timeout_s: float = 600.0) -> dict[str, list[dict]]:
    """Run every config at once, taking turns block by block.

    Args:
        configs: run_id -> config; every config's `steps` must be the same multiple of
            `block_steps`.
        block_steps: steps per turn (>= 2).

    Returns:
        run_id -> that run's events.

    Raises:
        ValueError: steps differ between configs or are not a multiple of block_steps.
        RuntimeError: a run did not succeed (its run_id and error), or a process ended early.
    """
    import multiprocessing as mp

    steps = {c.steps for c in configs.values()}
    if len(steps) != 1 or next(iter(steps)) % block_steps or block_steps < 2:
        raise ValueError(f"steps must be one multiple of block_steps={block_steps} for every run (got {sorted(steps)})")
    blocks = next(iter(steps)) // block_steps
    ctl = TurnController({rid: gate_ranks(c) for rid, c in configs.items()}, block_steps, timeout_s=timeout_s)
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="ddpviz-turns-") as tmp:
        os.environ[GATE_ENV] = ctl.spec  # inherited by every run's processes
        try:
            procs = {rid: ctx.Process(target=_child, args=(c.to_json_dict(), rid, f"{tmp}/{i}.json"), daemon=False)
                     for i, (rid, c) in enumerate(configs.items())}
            for p in procs.values():
                p.start()
            failure: BaseException | None = None
            try:
                ctl.run(rotated_order(list(configs), blocks), alive=lambda: all(p.is_alive() for p in procs.values()))
            except BaseException as exc:  # the runs' own errors, read below, say more
                failure = exc
            finally:
                for p in procs.values():  # after a failure the others fail at the gate (EOFError)
                    p.join(timeout=timeout_s)
                    if p.is_alive():
                        p.kill()
                        p.join()
        finally:
            os.environ.pop(GATE_ENV, None)
        out: dict[str, list[dict]] = {}
        errors = []
        for i, rid in enumerate(configs):
            path = Path(tmp, f"{i}.json")
            if not path.exists():
                errors.append(f"run {rid} ended without a result (exit code {procs[rid].exitcode})")
                continue
            got: dict[str, Any] = json.loads(path.read_text())
            if got["status"] != "succeeded":
                errors.append(f"run {rid} {got['status']}: {(got.get('error') or {}).get('exception')}")
            out[rid] = got["events"]
        if errors or failure is not None:
            raise RuntimeError("; ".join(errors) or f"turn-taking failed: {failure}") from failure
        return out
