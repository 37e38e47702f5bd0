"""`ddpviz doctor --gpu`'s check that a launched DDP rank synchronises only on its instrumented steps (issue 31.2).

A plain DDP loop never waits for the GPU. A launched rank (`engine.modes.ddp.rank`) waits once on each step
it marks as instrumented — metered (its `gil` event), memory-traced (`memory_traced`) and the last — and reads
every other step once its CUDA events completed (`engine.measure.deferred.DeferredSteps`: those step events
carry `step_time_source`). One rank runs in a child process (NCCL on cuda:0 at world size 1: DDP still buckets
and all-reduces every gradient), with every explicit synchronisation (`attach_sync.SYNC_CALLS`) counted and,
on CUDA, every implicit one PyTorch reports under `torch.cuda.set_sync_debug_mode("warn")` (`.item()`,
`float()` of a device tensor, a blocking copy), each with the step the rank was in (`engine.modes.ranks.progress`),
or, while a late step is read, that step.

The CPU twin (gloo, `DDPVIZ_DEFER_CPU_STEPS=1`) runs the same path with `StepClock.settle` doing what it does
on CUDA (`torch.cuda.synchronize`, counted, then refused by the CPU build), so its counts are real too.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import warnings
from pathlib import Path
from typing import Any

from ddpviz.engine.harness.attach_sync import SyncCounter

LAUNCHED_CFG = dict(mode="ddp", world_size=1, model="mlp", width=256, depth=4, global_batch_size=64, steps=30,
                    eval_every=0, step_delay_s=0.0, probe=False, bucket_cap_mb=0.1)


class StepSyncCounter(SyncCounter):
    """`SyncCounter` that also keeps, per call, the step the rank was in (`calls`: [[step, call]])."""

    def __init__(self, progress: dict) -> None:
        super().__init__()
        self.progress, self.calls = progress, []

    def _wrap(self, name: str, original: Any) -> Any:
        counted = super()._wrap(name, original)

        def noted(*args: Any, **kwargs: Any) -> Any:
            if self.counting:
                self.calls.append([self.progress["step"], name])
            return counted(*args, **kwargs)
        return noted


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(i: int, device_kind: str, cfg_fields: dict, tmp: str, extra_sync: str) -> None:
    """The rank (`start_rank_processes` target); writes tmp/result.json."""
    import torch

    from ddpviz.engine.config import RunConfig
    from ddpviz.engine.events import ListSink
    from ddpviz.engine.measure import clocks, deferred
    from ddpviz.engine.modes import ranks
    from ddpviz.engine.measure.deferred import DEFER_ON_CPU_ENV
    from ddpviz.engine.modes.ddp.rank import _train_rank

    cuda = device_kind == "cuda"
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    if not cuda:
        os.environ[DEFER_ON_CPU_ENV] = "1"
    counter, implicit = StepSyncCounter(ranks.progress).install(), []
    counter.counting = True
    result: dict[str, Any] = dict(device_kind=device_kind)
    try:
        def cuda_synchronize(*_: Any) -> None:  # counted by the wrapper; a CPU build then refuses it
            try:
                torch.cuda.synchronize()
            except (AssertionError, RuntimeError):
                pass

        if not cuda:  # StepClock.settle as on CUDA: one torch.cuda.synchronize
            clocks.StepClock.settle = cuda_synchronize
        read, add = deferred.DeferredSteps._read, deferred.DeferredSteps.add

        def read_as_its_step(item: Any) -> Any:  # a late step's read is charged to that step, not the one running
            running, ranks.progress["step"] = ranks.progress["step"], item[0]
            try:
                if extra_sync == "read":  # the tests' broken instrumentation: a synchronize as a late step is read
                    cuda_synchronize()
                return read(item)
            finally:
                ranks.progress["step"] = running

        def add_with_sync(self, *args: Any) -> None:  # the tests' broken instrumentation: one as it is issued
            cuda_synchronize()
            add(self, *args)
        deferred.DeferredSteps._read = staticmethod(read_as_its_step)
        if extra_sync == "issue":
            deferred.DeferredSteps.add = add_with_sync
        sink = ListSink()
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            shown = warnings.showwarning
            warnings.showwarning = lambda message, category, filename, lineno, *a, **k: (
                implicit.append([ranks.progress["step"], f"{message} ({filename}:{lineno})"])
                if "synchroniz" in str(message) else shown(message, category, filename, lineno, *a, **k))
            if cuda:
                torch.cuda.set_device(0)
                torch.cuda.set_sync_debug_mode("warn")
            try:
                _train_rank(RunConfig(**{**cfg_fields, "device": device_kind}), "syncprobe", 0, Path(tmp),
                            "nccl" if cuda else "gloo", device_kind, sink, "")
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")
                ranks.leave_process_group()
        result["events"] = [dict(type=e["type"], step=e.get("step"), memory_traced=e.get("memory_traced", False),
                                 step_time_source=e.get("step_time_source")) for e in sink.events
                            if e["type"] in ("step", "gil")]
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        counter.remove()
    result["explicit_syncs"] = counter.calls
    result["implicit_syncs"] = implicit
    Path(tmp, "result.json").write_text(json.dumps(result))


def launched_sync_probe(device_kind: str = "cuda", cfg: dict | None = None, extra_sync: str = "") -> dict:
    """Train one launched DDP rank (module docstring) and record each synchronisation with its step.

    Returns ``{events: [{type, step, memory_traced, step_time_source}] (its step and gil events),
    explicit_syncs: [[step, call]], implicit_syncs: [[step, message]]}``, or with ``error``.
    `extra_sync` adds a synchronize to every late step, as it is issued ("issue") or read ("read"): a broken
    instrumentation, for the tests.
    """
    from ddpviz.engine.modes.ranks import start_rank_processes

    with tempfile.TemporaryDirectory(prefix="ddpviz-launched-sync-") as tmp:
        try:
            start_rank_processes(_rank, (device_kind, cfg or LAUNCHED_CFG, tmp, extra_sync), 1)
        except Exception as exc:
            return dict(error=f"the rank process died: {type(exc).__name__}: {exc}")
        return json.loads(Path(tmp, "result.json").read_text())


def launched_sync_verdict(result: dict, steps: int) -> tuple[bool, str]:
    """Whether the rank of `launched_sync_probe` (a run of `steps` steps) sent every step, read at least a third
    of them late, and synchronised on none of those (explicitly or as PyTorch reported); the reason in words."""
    if "error" in result:
        return False, f"the rank failed: {result['error']}"
    rows = [e for e in result["events"] if e["type"] == "step"]
    late = {e["step"] for e in rows if e["step_time_source"]}
    instrumented = {e["step"] for e in rows if not e["step_time_source"]}
    problems = []
    if [e["step"] for e in rows] != list(range(steps)):
        problems.append(f"{len(rows)} step events for {steps} steps, or out of order")
    if len(late) < steps // 3:
        problems.append(f"only {len(late)} of {steps} steps read without a synchronize")
    in_late = [s for s in result["explicit_syncs"] + result["implicit_syncs"] if s[0] in late]
    if in_late:
        problems.append(f"{len(in_late)} synchronisation(s) in steps read late: {in_late[:4]}")
    if problems:
        return False, "; ".join(problems)
    return True, (f"{len(late)} of {steps} steps read once their events completed, with no synchronisation; "
                  f"{len(result['explicit_syncs'])} explicit and {len(result['implicit_syncs'])} reported ones "
                  f"on the {len(instrumented)} instrumented steps (metered, memory-traced, the last)")
