"""`ddpviz doctor --gpu`'s check that attaching adds no per-step synchronisation (issue 24).

One process is instrumented as `ddpviz run` instruments a torchrun worker (`engine.attach.install`
with the run's variables and torchrun's RANK/LOCAL_RANK/WORLD_SIZE), then trains a DDP the way a
script does: NCCL on cuda:0 at world size 1 (DDP still buckets and all-reduces every gradient
through the comm hook), or gloo on CPU for the check's CPU twin in the tests. Over the steps after
DDP's bucket rebuild it counts every call that makes the host wait for the GPU:

- explicit: `torch.cuda.synchronize`, `torch.cuda.Event.synchronize`, `torch.cuda.Stream.synchronize`
  (wrapped here to count; each call is still made);
- implicit: an operation that reads a device value on the host (`.item()`, `.cpu()`, a
  non-blocking-less copy), which PyTorch reports itself under `torch.cuda.set_sync_debug_mode("warn")`
  (a UserWarning per synchronising call; CUDA only).

The loop calls none of them (no `.item()`: the loss stays on the device), so every count is the
instrumentation's. Then the process's own events (its spool file) must hold each step and the
buckets of each synced backward: on CUDA their times come from CUDA events read once completed
(`Event.query()`), so the last steps' buckets may still be pending when training stops; they are
written at exit.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

SYNC_CALLS = ("torch.cuda.synchronize", "torch.cuda.Event.synchronize", "torch.cuda.Stream.synchronize")
WARMUP_STEPS = 3  # DDP rebuilds its buckets in the forward after the first synced backward


class SyncCounter:
    """Counts the explicit host-device synchronisations (`SYNC_CALLS`) while `counting` is True.
    `install()` wraps them (each wrapper calls the original), `remove()` puts them back."""

    def __init__(self) -> None:
        self.counts = {name: 0 for name in SYNC_CALLS}
        self.counting = False
        self._saved: list[tuple[Any, str, Any]] = []

    def install(self) -> "SyncCounter":
        for name in SYNC_CALLS:
            owner_path, attr = name.rsplit(".", 1)
            owner = torch.cuda if owner_path == "torch.cuda" else getattr(torch.cuda, owner_path.split(".")[-1])
            original = getattr(owner, attr)
            self._saved.append((owner, attr, original))
            setattr(owner, attr, self._wrap(name, original))
        return self

    def _wrap(self, name: str, original: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.counting:
                self.counts[name] += 1
            return original(*args, **kwargs)
        return counted

    def remove(self) -> None:
        for owner, attr, original in reversed(self._saved):
            setattr(owner, attr, original)
        self._saved.clear()


def _rank(i: int, device_kind: str, steps: int, tmp: str, extra_sync: bool, instrumented: bool) -> None:
    """The instrumented training process (`start_rank_processes` target); writes tmp/result.json."""
    import torch.distributed as dist
    import torch.nn as nn

    env = {"DDPVIZ_ATTACH_RUN_ID": "syncprobe", "DDPVIZ_ATTACH_SPOOL": tmp, "RANK": "0", "LOCAL_RANK": "0",
           "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0"}
    os.environ.update(env)
    result: dict[str, Any] = dict(device_kind=device_kind, steps=steps)
    counter = SyncCounter().install()
    try:
        from ddpviz.engine.attach import install
        from ddpviz.engine.modes.ranks import join_process_group, leave_process_group

        session = install(env) if instrumented else None
        cuda = device_kind == "cuda"
        dev = torch.device("cuda:0" if cuda else "cpu")
        if cuda:
            torch.cuda.set_device(0)
        join_process_group("nccl" if cuda else "gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1,
                           timeout=timedelta(seconds=120))
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                              nn.Linear(1024, 1)).to(dev)
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=[0] if cuda else None, bucket_cap_mb=1)
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        x, y = torch.randn(64, 256, device=dev), torch.randn(64, 1, device=dev)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step in range(steps):
                steady = step >= WARMUP_STEPS
                counter.counting = steady
                if cuda and steady:
                    torch.cuda.set_sync_debug_mode("warn")
                loss = nn.functional.mse_loss(ddp(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if extra_sync and steady:  # the tests' broken instrumentation: one synchronize a step
                    try:
                        torch.cuda.synchronize()
                    except (AssertionError, RuntimeError):  # a CPU build: counted, nothing to wait for
                        pass
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
            counter.counting = False
        result["explicit_syncs"] = dict(counter.counts)
        result["implicit_syncs"] = sorted({str(w.message) for w in caught if "synchroniz" in str(w.message)})
        result["steady_steps"] = steps - WARMUP_STEPS
        if cuda:
            torch.cuda.synchronize()
        if session is not None:
            result["disabled"] = sorted(session.disabled)
            for part, fn in (("steps", session.tracker.close), ("run_started", session.started.at_exit),
                             ("memory", session.memory.close)):  # as at exit (atexit does not run in this child)
                session.guard(part, fn)
            session.close()
        leave_process_group()
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        counter.remove()
    Path(tmp, "result.json").write_text(json.dumps(result))


def attach_sync_probe(device_kind: str = "cuda", steps: int = 12, extra_sync: bool = False,
                      instrumented: bool = True) -> dict[str, Any]:
    """Train `steps` DDP steps in one instrumented process (module docstring) and count its syncs;
    ``instrumented=False`` runs the same loop without ddpviz (the reference: what plain DDP itself does).

    Returns ``{explicit_syncs: {call: n}, implicit_syncs: [warning], steady_steps, disabled: [part],
    step_events, bucket_steps: [step], bucket_devices: [device]}``, or ``{error}``.
    `extra_sync` adds one synchronize per steady step (a broken instrumentation, for the tests).
    """
    from ddpviz.engine.modes.ranks import start_rank_processes

    with tempfile.TemporaryDirectory(prefix="ddpviz-attach-sync-") as tmp:
        try:
            start_rank_processes(_rank, (device_kind, steps, tmp, extra_sync, instrumented), 1)
        except Exception as exc:
            return dict(error=f"the instrumented process died: {type(exc).__name__}: {exc}")
        result = json.loads(Path(tmp, "result.json").read_text())
        events = [json.loads(line) for p in Path(tmp).glob("events-*.jsonl")
                  for line in p.read_text().splitlines() if line.strip()]
    result["step_events"] = sum(e["type"] == "step" for e in events)
    buckets = [e for e in events if e["type"] == "bucket"]
    result["bucket_steps"] = sorted({e["step"] for e in buckets})
    result["bucket_devices"] = sorted({str(e.get("device")) for e in buckets})
    return result


def attach_sync_verdict(plain: dict[str, Any], attached: dict[str, Any]) -> tuple[bool, str]:
    """Whether the instrumented probe (`attached`) made the host wait no more often than the same
    loop without ddpviz (`plain`) over the steady steps, with every step and each step's buckets in
    its events; and the reason in words."""
    for name, r in (("plain", plain), ("attached", attached)):
        if "error" in r:
            return False, f"the {name} run failed: {r['error']}"
    steps, steady = attached["steps"], attached["steady_steps"]
    added = {k: attached["explicit_syncs"][k] - plain["explicit_syncs"][k] for k in SYNC_CALLS
             if attached["explicit_syncs"][k] > plain["explicit_syncs"][k]}
    implicit = sorted(set(attached["implicit_syncs"]) - set(plain["implicit_syncs"]))
    problems = []
    if added:
        problems.append(f"{sum(added.values())} explicit synchronisation(s) in {steady} steady steps ({added})")
    if implicit:
        problems.append(f"synchronising operations PyTorch reported: {implicit}")
    if attached.get("disabled"):
        problems.append(f"instrumentation switched off: {attached['disabled']}")
    if attached["step_events"] != steps:
        problems.append(f"{attached['step_events']} step events for {steps} steps")
    if attached["bucket_steps"] != list(range(steps)):
        problems.append(f"buckets recorded for steps {attached['bucket_steps']} of 0..{steps - 1}")
    if problems:
        return False, "; ".join(problems)
    return True, (f"{steady} steady steps on {attached['bucket_devices']}: no synchronisation beyond plain DDP's "
                  f"({sum(plain['explicit_syncs'].values())} explicit, {len(plain['implicit_syncs'])} reported), "
                  f"{steps} step events, buckets of every step")
