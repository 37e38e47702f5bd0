"""The attach start-up hook: who is instrumented, the child's PYTHONPATH, and chaining to the
sitecustomize that would have run without ddpviz (issue 24, item 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddpviz.engine.attach.env import (RANK_PID_ENV, RUN_ID_ENV, SOLO_ENV, SPOOL_ENV, STARTUP_DIR,
                                      child_environment, process_role, should_instrument)

REPO = Path(__file__).resolve().parents[2]
RUN = {RUN_ID_ENV: "abc", SPOOL_ENV: "/tmp/spool"}


def test_only_torchrun_workers_or_the_launchers_own_child_are_instrumented():
    assert should_instrument({**RUN, "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"})
    assert not should_instrument({**RUN})  # torchrun's agent: no RANK of its own
    assert not should_instrument({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"})  # not a run
    assert should_instrument({**RUN, SOLO_ENV: "42"}, parent_pid=42)
    assert not should_instrument({**RUN, SOLO_ENV: "42"}, parent_pid=7)  # a grandchild
    assert not should_instrument({**RUN, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                                  "DDPVIZ_ATTACH_OFF": "1"})


def test_a_ranks_descendants_are_dormant_and_any_other_process_waits_for_a_process_group():
    worker = {**RUN, "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}
    assert process_role(worker) == "rank"
    assert process_role({**worker, RANK_PID_ENV: "99"}) == "dormant"  # its DataLoader worker, its helper
    assert process_role({**RUN, SOLO_ENV: "42"}, parent_pid=42) == "rank"
    assert process_role({**RUN, SOLO_ENV: "42", RANK_PID_ENV: "43"}, parent_pid=43) == "dormant"  # Lightning's rank 1
    assert process_role({**RUN}) == "dormant"  # torchrun's agent: becomes a rank only by init_process_group
    assert process_role({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}) == "off"
    assert process_role({**worker, "DDPVIZ_ATTACH_OFF": "1"}) == "off"


def test_only_the_startup_folder_goes_on_pythonpath_and_no_secret_in_the_env(tmp_path):
    base = {"PYTHONPATH": "/user/a:/user/b", "REDIS_URL": "redis://:pw@h:6379/0", RANK_PID_ENV: "7",
            "DDPVIZ_ATTACH_URL": "redis://:pw@h:6379/0"}
    env = child_environment(base, "abc", tmp_path)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(STARTUP_DIR), "/user/a", "/user/b"]  # not the repository
    assert env[RUN_ID_ENV] == "abc" and env[SPOOL_ENV] == str(tmp_path)
    assert RANK_PID_ENV not in env and "DDPVIZ_ATTACH_URL" not in env
    assert not any("pw@" in v for k, v in env.items() if k.startswith("DDPVIZ"))


def _python(code: str, pythonpath: list[str], **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("DDPVIZ_ATTACH")}
    e.update(env, PYTHONPATH=os.pathsep.join(pythonpath))
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=60)


def test_the_users_own_sitecustomize_still_runs(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import builtins\nbuiltins.USER_SITE_RAN = True\n")
    out = _python("import builtins, sys; print(getattr(builtins, 'USER_SITE_RAN', False), 'torch' in sys.modules)",
                  [str(STARTUP_DIR), str(user), str(REPO)])
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]  # chained; not a run: torch not even imported


def test_a_broken_instrumentation_says_one_line_and_the_program_runs(tmp_path):
    # a run's environment with a spool the hook cannot write into: install fails, the program runs
    out = _python("import torch; print('program ran')", [str(STARTUP_DIR), str(REPO)], **{
        RUN_ID_ENV: "abc", SPOOL_ENV: "/proc/forbidden", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "program ran"
    assert out.stderr.count("ddpviz: instrumentation off in this process") == 1


def test_a_python_without_ddpviz_in_an_attached_run_says_nothing(tmp_path):
    """A Python of another installation (here Debian's) that the command or its script starts finds ddpviz's start-up
    hook on PYTHONPATH but no ddpviz: it runs as without ddpviz, with no line of ddpviz's (there was one in every such
    process, 2026-12-06); `ddpviz run` says why when nothing trained instrumented (test_attach_private.py)."""
    other = "/usr/bin/python3"
    probe = subprocess.run([other, "-c", "import ddpviz"], env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path,
                           capture_output=True) \
        if os.path.exists(other) else None
    if probe is None or probe.returncode == 0:
        pytest.skip(f"no Python without ddpviz at {other}")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(STARTUP_DIR), RUN_ID_ENV: "abc", SPOOL_ENV: str(tmp_path),
           "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    out = subprocess.run([other, "-c", "print('program ran')"], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert (out.returncode, out.stdout, out.stderr) == (0, "program ran\n", "")


BUILTIN = """
import json, os, sys, torch, torch.distributed as dist, torch.nn as nn
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
ddp = nn.parallel.DistributedDataParallel(model)
ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
torch.manual_seed(100 + dist.get_rank())  # each rank its own data: the average is not either rank's
for _ in range(3):
    ddp(torch.randn(8, 16)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
torch.save([p.detach() for p in model.parameters()], sys.argv[1] + f".{dist.get_rank()}")
# the DDP (its reducer's gloo work) freed while the interpreter is alive: left to finalization, plain torch 2.13 aborted
# now and then ("terminate called without an active exception", SIGABRT; 2 of ~10 runs of this test on 2026-12-07,
# none of 80 outside pytest), the teardown pytorch/pytorch#179291 describes
del ddp, opt
import gc; gc.collect()
dist.destroy_process_group()
"""


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_builtin_comm_hook_runs_as_its_python_twin_with_the_same_result(tmp_path):
    """At world size 2, each rank with its own data: DDP's C++ FP16_COMPRESS hook (plain) and the
    Python twin ddpviz runs in its place (attached) must give bit-identical parameters on every
    rank; a twin that divided by the world size twice, or not at all, or after the all-reduce in
    fp16, would not (at world size 1, dividing by 1 hid all of these)."""
    import json

    import torch

    from ddpviz.engine.components.ports import free_port

    script = tmp_path / "train.py"
    script.write_text(BUILTIN)

    def run(out: str, pythonpath: list[str], **env: str) -> None:
        e = {k: v for k, v in os.environ.items() if not k.startswith("DDPVIZ_ATTACH")}
        e.update(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2",
                 PYTHONPATH=os.pathsep.join(pythonpath))
        procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / out)],
                                  env={**e, "RANK": str(r), "LOCAL_RANK": str(r)},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
        try:
            outs = [p.communicate(timeout=300) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        for p, (_, err) in zip(procs, outs):
            assert p.returncode == 0, err

    run("plain.pt", [str(REPO)])
    spool = tmp_path / "spool"
    run("att.pt", [str(STARTUP_DIR), str(REPO)], **{RUN_ID_ENV: "r", SPOOL_ENV: str(spool)})
    a0, a1, b0 = (torch.load(tmp_path / f) for f in ("att.pt.0", "att.pt.1", "plain.pt.0"))
    assert all(torch.equal(x, y) for x, y in zip(a0, a1))  # the ranks agree with each other
    assert all(torch.equal(x, y) for x, y in zip(a0, b0))  # DDP's C++ fp16 hook and its Python twin agree
    events = [json.loads(line) for f in spool.glob("events-*.jsonl") for line in f.read_text().splitlines()]
    buckets = [e for e in events if e["type"] == "bucket"]
    steps = sorted((e["rank"], e["step"]) for e in events if e["type"] == "step")
    assert steps == [(r, s) for r in (0, 1) for s in range(3)]
    assert {e["rank"] for e in buckets} == {0, 1}
    assert all(e["nbytes"] * 2 == e["uncompressed_nbytes"] for e in buckets)  # fp16 on the wire
    # `ddpviz run`'s default on gloo: DDP runs its C++ hook itself; run_started names it as the buckets do (it said
    # None, 2026-12-06)
    run("auto.pt", [str(STARTUP_DIR), str(REPO)],
        **{RUN_ID_ENV: "r2", SPOOL_ENV: str(tmp_path / "auto"), "DDPVIZ_ATTACH_BUCKET_TIMING": "auto"})
    assert all(torch.equal(x, y) for x, y in zip(torch.load(tmp_path / "auto.pt.0"), b0))
    events = [json.loads(line) for f in (tmp_path / "auto").glob("events-*.jsonl")
              for line in f.read_text().splitlines()]
    named = {e["comm_hook"] for e in events if e["type"] == "bucket"}
    assert len(named) == 1 and "FP16_COMPRESS" in next(iter(named)), named
    assert [e["config"]["comm_hook"] for e in events if e["type"] == "run_started"] == list(named)


def run_as_rank_0(tmp_path: Path, code: str, *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """`code` as a script run as rank 0 of a world of 1 with the start-up hook first on PYTHONPATH, as `ddpviz run`
    starts a rank; returns the finished process (it must exit 0) and every event of its spool."""
    import json

    script, spool = tmp_path / "train.py", tmp_path / "spool"
    script.write_text(code)
    e = {k: v for k, v in os.environ.items() if not k.startswith("DDPVIZ_ATTACH")}
    e.update({RUN_ID_ENV: "r", SPOOL_ENV: str(spool), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
              "PYTHONPATH": os.pathsep.join([str(STARTUP_DIR), str(REPO)])})
    out = subprocess.run([sys.executable, str(script), *args], env=e, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out, [json.loads(line) for f in spool.glob("events-*.jsonl") for line in f.read_text().splitlines()]


NO_DDP = """
import sys, time, torch, torch.nn as nn
torch.manual_seed(0)
model = nn.DataParallel(nn.Linear(8, 1))  # on CPU: the module itself
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    time.sleep(0.03)  # the script's data loading: before the forward, which no wrapped module times here
    loss = nn.functional.mse_loss(model(torch.randn(16, 8)), torch.zeros(16, 1))
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


def test_a_script_without_ddp_still_gets_its_steps_and_a_dataparallel_note(tmp_path):
    out, events = run_as_rank_0(tmp_path, NO_DDP)
    steps = [e for e in events if e["type"] == "step"]
    assert [e["step"] for e in steps] == [0, 1, 2, 3]  # the script's four optimizer steps
    assert all(e["micro_steps"] == 1 and e["no_sync_micro_steps"] == 0 and e["loss"] > 0 for e in steps)
    # no wrapped module saw the batch (16 samples): samples and samples/s not measured, never 0
    assert all(e["samples"] is None and e["samples_per_s"] is None for e in steps)
    assert all(e["samples_source"].startswith("not seen:") for e in steps)
    # a step runs from the last one's end, its 30 ms of loading included (it began at the backward: 0.4 ms of a
    # 0.7 ms step, a new user, 2026-12-06); the forward is not seen: null, never 0
    assert all(e["step_time_s"] >= 0.03 and e["forward_s"] is None for e in steps[1:])
    notes = [e["message"] for e in events if e["type"] == "log"]
    assert notes == ["nn.DataParallel on CPU runs the module unwrapped: no DP phases to record"]
    started = [e for e in events if e["type"] == "run_started"]
    assert len(started) == 1 and started[0]["mode"] == "single"
    assert started[0]["config"]["global_batch_size"] is None and started[0]["micro_batch_per_device"] is None


TWO_DDPS = """
import torch, torch.distributed as dist, torch.nn as nn
dist.init_process_group("gloo")
torch.manual_seed(0)
gen, disc = nn.Sequential(), nn.Sequential()
gen.add_module("gen", nn.Linear(4, 8))
disc.add_module("disc", nn.Linear(8, 1))
G, D = nn.parallel.DistributedDataParallel(gen), nn.parallel.DistributedDataParallel(disc)
opt = torch.optim.SGD(list(G.parameters()) + list(D.parameters()), lr=0.1)
for step in range(3):
    D(G(torch.randn(16, 4))).pow(2).mean().backward()  # two DDP forwards, one backward reducing both
    opt.step()
    opt.zero_grad()
"""


def _one_rank_events(tmp_path, source: str, **env: str) -> list[dict]:
    """Run `source` as rank 0 of 1 (gloo) with the start-up hook, as `ddpviz run` starts it (`env`: more
    variables, e.g. its bucket timing); its events, after checking it exited 0 with no instrumentation part
    switched off."""
    import json

    script = tmp_path / "train.py"
    script.write_text(source)
    spool = tmp_path / "spool"
    e = {k: v for k, v in os.environ.items() if not k.startswith("DDPVIZ_ATTACH")}
    e.update({RUN_ID_ENV: "r", SPOOL_ENV: str(spool), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
              "PYTHONPATH": os.pathsep.join([str(STARTUP_DIR), str(REPO)]), **env})
    out = subprocess.run([sys.executable, str(script)], env=e, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "instrumentation off" not in out.stderr, out.stderr
    return [json.loads(line) for f in spool.glob("events-*.jsonl") for line in f.read_text().splitlines()]


DCGAN = """
import torch, torch.distributed as dist, torch.nn as nn
dist.init_process_group("gloo")
torch.manual_seed(0)
gen, disc = nn.Sequential(), nn.Sequential()
gen.add_module("gen", nn.Linear(4, 8))
disc.add_module("disc", nn.Linear(8, 1))
G, D = nn.parallel.DistributedDataParallel(gen), nn.parallel.DistributedDataParallel(disc)
opt_g, opt_d = torch.optim.SGD(G.parameters(), lr=0.1), torch.optim.SGD(D.parameters(), lr=0.1)
for it in range(2):  # PyTorch's DCGAN example: one G forward, a D step on it detached, then a G step
    fake = G(torch.randn(16, 4))
    D(fake.detach()).pow(2).mean().backward()  # reduces D only
    opt_d.step()
    opt_d.zero_grad()
    D(fake).mean().backward()  # reduces D and, through fake, G
    opt_g.step()
    opt_g.zero_grad()
    opt_d.zero_grad()
"""


@pytest.mark.parametrize("timing", ["hook", "auto"])
def test_a_dcgan_loop_gives_the_generator_the_backward_that_reduced_it(tmp_path, timing):
    """The generator's forward comes a step before its reduce (the D step's optimizer ends that step):
    its buckets are those of the G step's backward (before, they were never written). Under `ddpviz run`'s
    default (auto) too: with no hook G's buckets went on the D steps, timed by D's all-reduce (2026-12-06)."""
    events = _one_rank_events(tmp_path, DCGAN, DDPVIZ_ATTACH_BUCKET_TIMING=timing)
    g_bytes, d_bytes = (4 * 8 + 8) * 4, (8 * 1 + 1) * 4
    per_step = {s: sorted(b["ddp_index"] for b in events if b["type"] == "bucket" and b["step"] == s) for s in range(4)}
    assert per_step == {0: [1], 1: [0, 1], 2: [1], 3: [0, 1]}  # D steps: D's bucket; G steps: both
    volumes = [(v["step"], v["allreduce_bytes"], v["ddp_count"]) for v in events if v["type"] == "comm_volume"]
    assert volumes == [(0, d_bytes, 1), (1, g_bytes + d_bytes, 2), (2, d_bytes, 1), (3, g_bytes + d_bytes, 2)]
    assert [e["step"] for e in events if e["type"] == "step"] == [0, 1, 2, 3]  # two optimizer steps an iteration
    assert all(b["comm_end_s"] is not None for b in events if b["type"] == "bucket")  # the hook times every one


def test_two_ddps_before_one_backward_both_get_their_buckets(tmp_path):
    """A GAN's D(G(z)).backward(): each DDP's buckets are recorded in every step (before, only the
    last DDP's forward was seen; the other's bucket records grew, never emitted)."""
    events = _one_rank_events(tmp_path, TWO_DDPS)
    buckets = [e for e in events if e["type"] == "bucket"]
    grad_bytes = (4 * 8 + 8 + 8 * 1 + 1) * 4  # both models' fp32 gradients
    for step in range(3):
        assert sum(b["nbytes"] for b in buckets if b["step"] == step) == grad_bytes, step
    names = {n for b in buckets for n in b.get("param_names", [])}
    assert names == {"gen.weight", "gen.bias", "disc.weight", "disc.bias"}
    assert [e["micro_steps"] for e in events if e["type"] == "step"] == [1, 1, 1]
    # each DDP's one bucket is its bucket 0; ddp_index says which: G was built first
    for step in range(3):
        assert sorted((b["ddp_index"], b["bucket_index"]) for b in buckets if b["step"] == step) == [(0, 0), (1, 0)]
    owner = {n: b["ddp_index"] for b in buckets for n in b.get("param_names", [])}
    assert owner == {"gen.weight": 0, "gen.bias": 0, "disc.weight": 1, "disc.bias": 1}
    volumes = [e for e in events if e["type"] == "comm_volume"]  # one per step, both DDPs' bytes
    assert [(v["step"], v["allreduce_bytes"], v["ddp_count"]) for v in volumes] == [(s, grad_bytes, 2) for s in range(3)]


LOSSES = """
import sys, torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo", init_method=sys.argv[1], rank=0, world_size=1)
torch.manual_seed(0)
ddp = DDP(nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1)))
x = torch.randn(16, 6); y = x.sum(1, keepdim=True)
sgd = torch.optim.SGD(ddp.parameters(), lr=0.01)
for _ in range(2):  # two backwards of one forward: the step's loss is both
    o = ddp(x); l1, l2 = o.pow(2).mean(), o.abs().mean()
    sgd.zero_grad(); l1.backward(retain_graph=True); l2.backward(); sgd.step()
    print("RETAIN", l1.item() + l2.item())
lbfgs = torch.optim.LBFGS(ddp.parameters(), lr=0.5, max_iter=4)
for _ in range(2):  # the closure runs up to 4 times on the same 16 samples: the step's loss is its first
    def closure():
        lbfgs.zero_grad(); l = (ddp(x) - y).pow(2).mean(); l.backward(); return l
    print("LBFGS", lbfgs.step(closure).item())
o = ddp(x); o.backward(torch.ones_like(o) / 16); sgd.step()  # no one-element tensor: no loss to read
"""


def test_a_steps_loss_is_the_scripts_for_two_backwards_a_closure_and_none(tmp_path):
    """Reference: the losses the script prints. `l1.backward(retain_graph=True); l2.backward()` was recorded as l1;
    LBFGS as the sum of its closure's 4-5 evaluations, with 5 batches of samples; a non-scalar backward as null
    with a source saying it summed scalars (a new user, 2026-12-06)."""
    from ddpviz.engine.attach.steps import LOSS_NOT_SEEN

    out, events = run_as_rank_0(tmp_path, LOSSES, f"file://{tmp_path}/pg")
    said = [float(line.split()[1]) for line in out.stdout.splitlines()]
    steps = sorted((ev for ev in events if ev["type"] == "step"), key=lambda ev: ev["step"])
    assert [ev["loss"] for ev in steps[:4]] == pytest.approx(said, rel=1e-6)
    assert [ev["samples"] for ev in steps[:4]] == [16, 16, 16, 16]
    assert steps[2]["micro_steps"] > 1  # LBFGS did evaluate its closure more than once
    assert steps[4]["loss"] is None and steps[4]["loss_source"] == LOSS_NOT_SEEN


SPARSE = """
import torch, torch.distributed as dist, torch.nn as nn
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Embedding(50, 16, sparse=True), nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    model(torch.tensor([[1, 2, 3, 4, 5]] * 4)).sum().backward()  # 20 lookups a step
    opt.step()
    opt.zero_grad()
"""


def test_a_sparse_buckets_bytes_are_said_to_be_its_values_and_indices(tmp_path):
    """Reference, by hand: the embedding's COO gradient holds 20 lookups, 20 int64 indices and 20 x 16 float32
    values = 1,440 B; its `nbytes_source` said "bucket buffer (DDP's flat gradients)" (a new user's trial)."""
    from ddpviz.engine.attach.comm import SPARSE_BYTES

    events = _one_rank_events(tmp_path, SPARSE, DDPVIZ_ATTACH_BUCKET_TIMING="auto")  # sparse: the hook, always
    sparse = [b for b in events if b["type"] == "bucket" and b["nbytes_source"] == SPARSE_BYTES]
    assert [b["step"] for b in sparse] == [0, 1, 2], sparse
    assert all(b["nbytes"] == 20 * 8 + 20 * 16 * 4 for b in sparse), [b["nbytes"] for b in sparse]
