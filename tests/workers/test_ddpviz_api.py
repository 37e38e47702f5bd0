"""The public `ddpviz` package: `ddpviz.watch` and `ddpviz.step` (issue 24, "An API for scripts
that want it").

- examples/attach/train_two_optimizers.py (two optimizer steps per iteration, `ddpviz.step()` at
  each iteration's end) run unmodified by ``ddpviz run -- torchrun --nproc-per-node 2``: its steps,
  samples and losses against the script's own counts;
- the same script without ``ddpviz run``: one line says nothing is recorded, and the trained
  parameters are bitwise those of the script with its ddpviz lines taken out;
- a process ``ddpviz run`` reaches only through its environment (not instrumented at start-up)
  with a model that is no DDP: `watch` installs the instrumentation and records the model's
  forward and samples; `step` calls from the end of the first iteration on switch to explicit steps
  without counting that iteration twice.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys

import pytest
import torch
from attach_tools import EXAMPLES, by_rank, params, reports, run_attached, torchrun
from wtools import REPO

from ddpviz.engine.attach.env import OFF_ENV, RUN_ID_ENV, SPOOL_ENV
from ddpviz.engine.attach.steps import EXPLICIT_SAMPLES_SOURCE, SAMPLES_SOURCE
from ddpviz.workers.client import DdpvizClient
from ddpviz.workers.connection import connect, free_port
from ddpviz.workers.history import read_all_events

pytestmark = pytest.mark.slow

SCRIPT = "train_two_optimizers.py"
STEPS = 5


@pytest.fixture(scope="module")
def two_optimizers(tmp_path_factory, redis_url):
    """train_two_optimizers.py under ``ddpviz run -- torchrun --nproc-per-node 2``: one run for
    several assertions."""
    c = connect(redis_url)
    c.flushdb()
    tmp = tmp_path_factory.mktemp("two_optimizers")
    proc, run_id = run_attached(torchrun(SCRIPT, "--steps", str(STEPS)), redis_url, tmp / "att.json",
                                tmp / "spool")
    client = DdpvizClient(redis=c)
    yield dict(tmp=tmp, proc=proc, events=read_all_events(client, run_id), record=client.get_run(run_id))
    c.flushdb()


def test_explicit_steps_samples_and_losses_match_the_scripts_own_counts(two_optimizers):
    proc, rec = two_optimizers["proc"], two_optimizers["record"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    mine = reports(two_optimizers["tmp"] / "att.json")
    assert mine[0]["steps"] == mine[1]["steps"] == STEPS
    steps = by_rank(two_optimizers["events"], "step")
    for rank in (0, 1):
        rows = sorted(steps[rank], key=lambda e: e["step"])
        # one step per iteration, not one per optimizer step (the optimizer hooks would count 2 x STEPS)
        assert [e["step"] for e in rows] == list(range(mine[rank]["steps"]))
        # samples: each rank's ddpviz.step(samples=len(x)), x world size = what both ranks counted
        assert [e["samples"] for e in rows] == [a + b for a, b in zip(mine[0]["samples"], mine[1]["samples"])]
        assert [e["loss"] for e in rows] == pytest.approx(mine[rank]["losses"], rel=1e-6)
        assert {e["step_source"] for e in rows} == {"explicit"}
        assert {e["samples_source"] for e in rows} == {EXPLICIT_SAMPLES_SOURCE}
        assert [(e["micro_steps"], e["no_sync_micro_steps"]) for e in rows] == [(2, 0)] * STEPS
        assert all(e["forward_s"] > 0 and e["optimizer_s"] > 0 for e in rows)
        assert {e["step"] for e in by_rank(two_optimizers["events"], "bucket")[rank]} == set(range(STEPS))
    assert rec["status"] == "succeeded"
    assert rec["label"] == "two optimizers"  # ddpviz.watch(name=...), no --name given
    assert rec["summary"]["steps_done"] == STEPS


def _one_rank_env(report: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPVIZ_ATTACH")}
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), TRAIN_REPORT=report, PYTHONPATH=str(REPO), **extra)
    return env


def without_ddpviz(source: str) -> str:
    """The script with its ddpviz lines taken out: the import and the step calls become `pass`,
    the `with ddpviz.watch(...):` line `if True:` (same indentation, same lines)."""
    out = []
    for line in source.splitlines():
        indent = line[:len(line) - len(line.lstrip())]
        if re.fullmatch(r"\s*import ddpviz\s*", line) or re.fullmatch(r"\s*ddpviz\.step\(.*\)\s*", line):
            line = indent + "pass"
        elif re.fullmatch(r"\s*with ddpviz\.watch\(.*\):\s*", line):
            line = indent + "if True:"
        out.append(line)
    code = "\n".join(out) + "\n"
    tree = ast.parse(code)
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "ddpviz"
                or isinstance(n, ast.Import) and any(a.name == "ddpviz" for a in n.names)]
    return code


def test_outside_ddpviz_run_watch_and_step_say_one_line_and_leave_training_bitwise_unchanged(tmp_path):
    plain = subprocess.run([sys.executable, str(EXAMPLES / SCRIPT), "--steps", "3"],
                           env=_one_rank_env(str(tmp_path / "api.json")), capture_output=True, text=True,
                           timeout=300)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert [line for line in plain.stderr.splitlines() if "ddpviz" in line] == [
        "ddpviz: nothing is recorded (this process was not started by `ddpviz run`); "
        f"to record it: ddpviz run -- python {SCRIPT}"]
    bare = tmp_path / SCRIPT
    bare.write_text(without_ddpviz((EXAMPLES / SCRIPT).read_text()))
    ref = subprocess.run([sys.executable, str(bare), "--steps", "3"], env=_one_rank_env(str(tmp_path / "bare.json")),
                         capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr[-3000:]
    a, b = params(tmp_path / "api.json"), params(tmp_path / "bare.json")
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    assert reports(tmp_path / "api.json", nproc=1) == reports(tmp_path / "bare.json", nproc=1)


# A process of an attached run that the start-up hook does not instrument (no torchrun variables,
# not the launcher's own child, as behind a shell script), training a model that is no DDP, with one
# optimizer stepped with a closure and ddpviz.step() at each iteration's end (the first call comes
# after the optimizer ended step 0). A loss of the wrong shape is said once and left out.
LATE = """
import json, sys, torch, torch.nn as nn
import ddpviz
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
w = ddpviz.watch(model, opt, name="late")
for i in range(4):
    x = torch.randn(12, 8)

    def closure():  # the forward and backward run inside the optimizer step (as LBFGS, Lightning do)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), torch.zeros(12, 1))
        loss.backward()
        return loss

    loss = opt.step(closure)
    ddpviz.step(samples=10, loss=torch.zeros(2) if i == 2 else loss)
w.flush()
print(json.dumps(dict(recording=w.recording, run_id=w.run_id, rank=w.rank)))
"""


def test_watch_installs_late_records_a_plain_model_and_step_switches_without_counting_twice(tmp_path):
    spool = tmp_path / "spool"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDPVIZ_ATTACH", "RANK", "WORLD_SIZE"))}
    env.update({RUN_ID_ENV: "0123456789abcdef", SPOOL_ENV: str(spool), "PYTHONPATH": str(REPO)})
    out = subprocess.run([sys.executable, "-c", LATE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == dict(recording=True, run_id="0123456789abcdef", rank=0)
    events = [json.loads(line) for f in spool.glob("events-*.jsonl") for line in f.read_text().splitlines()]
    steps = sorted((e for e in events if e["type"] == "step"), key=lambda e: e["step"])
    assert [e["step"] for e in steps] == [0, 1, 2, 3]  # four iterations, four steps
    first, rest = steps[0], steps[1:]
    # step 0 ended at the optimizer step, before ddpviz.step was first called: samples from the batch
    # the watched model's forward received
    assert (first["step_source"], first["samples"], first["samples_source"]) == ("optimizer", 12, SAMPLES_SOURCE)
    assert 0 < first["optimizer_s"] < first["step_time_s"] - first["forward_s"]  # the closure's passes are not in it
    assert [(e["step_source"], e["samples"]) for e in rest] == [("explicit", 10)] * 3
    assert rest[1]["loss"] > 0  # the bad loss was left out: the loss backward() saw instead
    assert all(e["forward_s"] > 0 and e["micro_steps"] == 1 for e in steps)
    logs = [e["message"] for e in events if e["type"] == "log"]
    assert len(logs) == 2 and "steps 0-0 ended at optimizer steps" in logs[0] and "loss" in logs[1]
    started = [e for e in events if e["type"] == "run_started"]
    assert len(started) == 1 and started[0]["label"] == "late" and started[0]["mode"] == "single"
    assert started[0]["config"]["model"] == "Sequential" and started[0]["param_count"] == 8 * 16 + 16 + 16 + 1
    assert out.stderr.count("ddpviz:") == 2  # the two notes, once each


def test_off_switch_is_silent_and_records_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPVIZ_ATTACH")}
    env.update({RUN_ID_ENV: "0123456789abcdef", SPOOL_ENV: str(tmp_path / "spool"), OFF_ENV: "1",
                "PYTHONPATH": str(REPO)})
    code = "import ddpviz, torch; w = ddpviz.watch(torch.nn.Linear(2, 1)); ddpviz.step(); print(w.recording)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stdout.strip(), out.stderr) == (0, "False", "")
    assert not (tmp_path / "spool").exists()
