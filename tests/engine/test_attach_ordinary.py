"""An attached script's ordinary steps (`engine.attach.steps.StepTracker._ordinary`: one DDP on the recorder path,
only the last micro-step synced, not sampled) hand their readings to the event writer's thread, which builds the
bucket, comm_volume and step events there (issue 31: the script's thread pays for readings, not for events).

Tried with one micro-step a step and with two, the first under `no_sync()` (gradient accumulation, nanoGPT's way).
References, none of them ddpviz's ordinary path:
- the same script with the ordinary path switched off: the general path (`_emit_step`, the `VolumeBook`,
  `Watch.buckets`) writes every step, and each ordinary step's events must hold the same fields with the same
  non-timing values;
- the script's own losses (`loss.item()` after each step);
- PyTorch's post-accumulate-grad hooks, stamped by the script around its own `backward()` call: each bucket's `ready_s`
  is its last gradient's stamp within 2 ms (a 20 ms sleep in the backward between the two layers parts them), and the
  step's exposed comm the script's backward after the last stamp (10 ms more of the backward, into the input's
  gradient, after every bucket was ready);
- the bytes of the model's parameters, counted by the script (one bucket per layer).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# an attached script (ddpviz installed first), one gloo rank; argv[1] "general" switches the ordinary path off, argv[2]
# is its micro-steps a step, argv[3] this folder (tests/engine/field_models.py)
SCRIPT = r'''
import contextlib, json, os, socket, sys, time
from ddpviz.engine.attach import install
install()
from ddpviz.engine.attach import steps
calls = []
if sys.argv[1] == "general":
    steps.StepTracker._ordinary = lambda self, end: False
else:
    ordinary = steps.StepTracker._ordinary
    def counted(self, end):
        if ordinary(self, end):
            calls.append(self.step)
            return True
        return False
    steps.StepTracker._ordinary = counted
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
sys.path.insert(0, sys.argv[3])
from field_models import SleepInBackward

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)

    def forward(self, x):
        # 20 ms between the layers' gradients; 10 ms after the last one's, into the input's (every bucket ready)
        return self.second(SleepInBackward.apply(self.first(SleepInBackward.apply(x, 0.01)), 0.02))

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
torch.manual_seed(0)
ddp = DDP(Net(), bucket_cap_mb=0.01)  # one bucket per layer
stamped = {}
for n, p in ddp.module.named_parameters():
    p.register_post_accumulate_grad_hook(lambda p, n=n: stamped.__setitem__(n, time.perf_counter()))
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
x, y = torch.randn(8, 64, requires_grad=True), torch.randn(8, 64)
accum = int(sys.argv[2])  # micro-steps a step, all but the last under no_sync()
for step in range(10):
    losses, backward_s = [], 0.0
    for micro in range(accum):
        with (ddp.no_sync() if micro < accum - 1 else contextlib.nullcontext()):
            loss = torch.nn.functional.mse_loss(ddp(x), y) / accum
            t0 = time.perf_counter()
            loss.backward()
            t1 = time.perf_counter()
        losses.append(loss.item())
        backward_s += t1 - t0
    opt.step()
    opt.zero_grad()
    # the synced (last) backward's gradients: their stamps from its start
    ready = {layer: max(stamped[layer + ".weight"], stamped[layer + ".bias"]) - t0 for layer in ("first", "second")}
    print("STEP", json.dumps(dict(step=step, loss=sum(losses), ready=ready, backward_s=backward_s,
                                  last_backward_s=t1 - t0)))
print("ORDINARY", json.dumps(calls))
print("PARAM_BYTES", sum(p.numel() * p.element_size() for p in ddp.parameters()))
'''

TIMING = {"ts", "start_ts", "backward_start_ts", "step_time_s", "forward_s", "backward_s", "comm_exposed_s",
          "optimizer_s", "other_s", "samples_per_s", "ready_s"}


def _run(tmp_path, how: str, accum: int) -> tuple[dict[str, list], dict[int, dict], list[int], int]:
    spool = tmp_path / f"{how}-{accum}"
    spool.mkdir()
    here = str(Path(__file__).resolve().parent)
    out = subprocess.run([sys.executable, "-c", SCRIPT, how, str(accum), here], capture_output=True, text=True,
                         timeout=120,
                         env={"PATH": "/usr/bin:/bin", "DDPVIZ_ATTACH_RUN_ID": "ordinary", "KINETO_LOG_LEVEL": "6",
                              "DDPVIZ_ATTACH_BUCKET_TIMING": "auto",  # as `ddpviz run` sets it by default
                              "DDPVIZ_ATTACH_SPOOL": str(spool), "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    script = {d["step"]: d for d in (json.loads(line[5:]) for line in lines if line.startswith("STEP "))}
    ordinary = json.loads(next(line for line in lines if line.startswith("ORDINARY "))[9:])
    param_bytes = int(next(line for line in lines if line.startswith("PARAM_BYTES "))[12:])
    events: dict[str, list] = {}
    for path in spool.glob("events-*.jsonl"):
        for line in path.read_text().splitlines():
            e = json.loads(line)
            events.setdefault(e["type"], []).append(e)
    return events, script, ordinary, param_bytes


def _by_step(events: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for e in events:
        out.setdefault(e["step"], []).append(e)
    return out


def _constant(e: dict) -> dict:
    return {k: v for k, v in e.items() if k not in TIMING}


@pytest.fixture(scope="module", params=[1, 2], ids=["one micro-step", "two, the first under no_sync"])
def runs(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ordinary")
    return _run(tmp, "ordinary", request.param), _run(tmp, "general", request.param), request.param


def test_ordinary_steps_write_the_events_the_general_path_writes(runs):
    (fast, _, ordinary, _), (general, _, none, _), accum = runs
    assert none == [] and ordinary == [3, 4, 5, 6, 7, 8, 9], "steps 0-2 are sampled; every later one is ordinary"
    for kind in ("bucket", "comm_volume", "step"):
        a, b = _by_step(fast[kind]), _by_step(general[kind])
        assert sorted(a) == sorted(b) == list(range(10)), kind
        for step in ordinary:
            assert [set(e) for e in a[step]] == [set(e) for e in b[step]], (kind, step)
            assert [_constant(e) for e in a[step]] == [_constant(e) for e in b[step]], (kind, step)
    # what those constant fields say, for the ordinary steps
    for e in fast["step"]:
        if e["step"] in ordinary:
            assert e["comm_exposed_measured"] is True and e["samples"] == 8 * accum, e
            assert e["micro_steps"] == accum and e["no_sync_micro_steps"] == accum - 1, e


def test_ordinary_steps_measure_what_the_script_measures(runs):
    (fast, script, ordinary, param_bytes), _, accum = runs
    steps, buckets, volume = (_by_step(fast[k]) for k in ("step", "bucket", "comm_volume"))
    for step in ordinary:
        (event,), rows, (vol,) = steps[step], buckets[step], volume[step]
        ours = script[step]
        assert event["loss"] == pytest.approx(ours["loss"], rel=1e-6)
        layers = ["second", "first"]  # DDP's rebuilt order: the last layer's gradients are ready first
        assert [r["bucket_index"] for r in rows] == [0, 1] and [r["is_last"] for r in rows] == [False, True]
        for layer, r in zip(layers, rows):
            assert abs(r["ready_s"] - ours["ready"][layer]) < 0.002, (step, layer, r["ready_s"], ours["ready"])
        assert rows[1]["ready_s"] - rows[0]["ready_s"] >= 0.02
        assert sum(r["nbytes"] for r in rows) == param_bytes == vol["allreduce_bytes"]
        assert vol["sent_bytes"] == 0 and vol["world_size"] == 1, "a ring of one sends nothing"
        # the backwards the script timed hold the measured backward and its exposed comm
        assert event["backward_s"] + event["comm_exposed_s"] == pytest.approx(ours["backward_s"], abs=0.002 * accum)
        # and what the all-reduce added after the last gradient was ready, by the script's clock and PyTorch's hooks
        assert event["comm_exposed_s"] == pytest.approx(ours["last_backward_s"] - ours["ready"]["first"], abs=0.002)
        assert event["comm_exposed_s"] >= 0.008
