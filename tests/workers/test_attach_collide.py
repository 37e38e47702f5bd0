"""`ddpviz run` on a script written the way many research repos are (issue 32): its own `engine`,
`app`, `workers`, `models`, `utils`, `config` modules, a helper Python subprocess, spawn-started
DataLoader workers, a GradScaler (`scaler.scale(loss).backward()` and
`torch.autograd.backward(scaler.scale(loss))` on alternate steps) and an evaluation pass through
the DDP module under `torch.no_grad()` / `eval()` (examples/attach/collide/train.py).

References: the same script without ddpviz (its sys.modules, its parameters bit for bit), the
script's own counts (steps, unscaled losses, samples per step), and what its helper and DataLoader
workers report of their own processes. Neither run has the repository on PYTHONPATH, as for a user.
"""

from __future__ import annotations

import json
import sys

import pytest
from attach_tools import EXAMPLES, assert_params_bitwise_equal, by_rank, reports, run_attached, run_plain

from ddpviz.workers import keys
from ddpviz.workers.client import DdpvizClient
from ddpviz.workers.connection import connect, free_port
from ddpviz.workers.history import read_all_events

pytestmark = pytest.mark.slow
BATCH_PER_RANK = 16  # examples/attach/collide/config.py
STEPS = 6  # 192 samples / (2 ranks x 16)


@pytest.fixture(scope="module")
def client(redis_url):
    c = connect(redis_url)
    c.flushdb()
    c.set(keys.APP_URL, "http://127.0.0.1:8599")
    yield DdpvizClient(redis=c)
    c.flushdb()


@pytest.fixture(scope="module")
def collide(tmp_path_factory, redis_url, client):
    tmp = tmp_path_factory.mktemp("collide")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(free_port()), str(EXAMPLES / "collide" / "train.py")]
    out = {}
    for name in ("plain", "att"):
        workers = tmp / f"workers-{name}"
        workers.mkdir()
        extra = dict(PYTHONPATH="", COLLIDE_WORKERS_DIR=str(workers))
        if name == "plain":
            proc = run_plain(cmd, tmp / "plain.json", **extra)
            run_id = None
        else:
            proc, run_id = run_attached(cmd, redis_url, tmp / "att.json", tmp / "spool", **extra)
        assert proc.returncode == 0, proc.stderr[-4000:]
        out[name] = dict(proc=proc, run_id=run_id, reports=reports(tmp / f"{name}.json"),
                         workers=[json.loads(p.read_text()) for p in sorted(workers.glob("worker-*.json"))])
    run_id = out["att"]["run_id"]
    return dict(tmp=tmp, **out, events=read_all_events(client, run_id), record=client.get_run(run_id))


def test_the_script_trains_and_is_recorded_with_its_own_module_names(collide):
    assert collide["record"]["status"] == "succeeded"
    assert "[collide] rank 0: 6 steps" in collide["att"]["proc"].stdout  # its own app.py and engine.py ran
    started = [e for e in collide["events"] if e["type"] == "run_started"]
    assert len(started) == 1 and started[0]["world_size"] == 2
    steps = by_rank(collide["events"], "step")
    for rank in (0, 1):
        assert sorted(e["step"] for e in steps[rank]) == list(range(STEPS))


def test_the_recorded_loss_is_the_unscaled_one_and_says_so(collide):
    steps = by_rank(collide["events"], "step")
    for rank, mine in enumerate(collide["att"]["reports"]):
        rows = sorted(steps[rank], key=lambda e: e["step"])
        # the script's own loss.item() before scaler.scale: init_scale 1024 would show as x1024
        assert [e["loss"] for e in rows] == pytest.approx(mine["losses"], rel=1e-6)
        assert all("GradScaler" in e["loss_source"] for e in rows)


def test_eval_forwards_are_not_training_samples(collide):
    steps = by_rank(collide["events"], "step")
    for rank, mine in enumerate(collide["att"]["reports"]):
        rows = sorted(steps[rank], key=lambda e: e["step"])
        assert [e["samples"] for e in rows] == [n * 2 for n in mine["samples"]] == [BATCH_PER_RANK * 2] * STEPS
        assert all(e["micro_steps"] == 1 for e in rows)
    assert collide["record"]["summary"]["steps_done"] == STEPS


def test_only_the_two_ranks_are_instrumented(collide):
    mine = collide["att"]["reports"]
    expected = sorted(f"events-rank{r}-pid{m['pid']}.jsonl" for r, m in enumerate(mine))
    assert mine[0]["spool_files"] == expected  # was 10 files: helpers and DataLoader workers claimed ranks
    for m in mine:  # the helper subprocess: no torch, no instrumentation
        assert m["helper"]["torch"] is False
        assert "ddpviz.engine.attach.session" not in m["helper"]["ddpviz"]
    workers = collide["att"]["workers"]
    assert len(workers) == 2  # 1 per rank, started by spawn (one keeps the suite lighter: each imports torch)
    for w in workers:
        assert "ddpviz.engine.attach.session" not in w["ddpviz"], w
        assert all(f"pid{w['pid']}." not in f for f in mine[0]["spool_files"])


# Third-party modules the instrumentation itself imports into a rank (each an installed
# distribution, so a user's own module of that name would already shadow it): pydantic with its
# helpers (engine.config's RunConfig, which the attach path reaches), orjson (the event encoder),
# psutil (memory readings). Anything else ddpviz depends on (redis, pandas, streamlit...) must stay out.
INSTRUMENT_IMPORTS = {"pydantic", "pydantic_core", "annotated_types", "typing_inspection", "typing_extensions",
                      "orjson", "psutil"}


def _allowed_top_level() -> set[str]:
    """Top-level module names ddpviz may bring into a rank besides `ddpviz*` and its start-up
    hook: the standard library's and `INSTRUMENT_IMPORTS`."""
    return set(sys.stdlib_module_names) | INSTRUMENT_IMPORTS | {"sitecustomize"}


def test_the_rank_gains_no_module_name_outside_ddpviz(collide):
    allowed = _allowed_top_level()
    for plain, att in zip(collide["plain"]["reports"], collide["att"]["reports"]):
        gained = set(att["modules"]) - set(plain["modules"])
        # a package the script imported may gain submodules (torch's own lazy imports, e.g. the recorder path's
        # `torch.utils._python_dispatch._disable_current_modes` imports torch._subclasses.schema_check_mode): no
        # new top-level name, so nothing a module of the script's could collide with
        theirs = {m.split(".")[0] for m in plain["modules"]}
        foreign = sorted(m for m in gained if not m.startswith("ddpviz") and m.split(".")[0] not in allowed | theirs)
        assert foreign == []
        for name in ("engine", "app", "workers", "models", "utils", "config"):
            assert name in att["modules"]  # the script's own, imported by it
        assert not any(m.split(".")[0] in {"engine", "app", "workers"} and m not in plain["modules"]
                       for m in att["modules"])


def test_the_ranks_sys_path_is_the_plain_runs(collide):
    """ddpviz's start-up folder is on PYTHONPATH only for Python to find its sitecustomize; once it ran, the folder
    is off sys.path (before 2026-12-06 a rank's sys.path held it, though docs/attach.md said it adds nothing)."""
    for plain, att in zip(collide["plain"]["reports"], collide["att"]["reports"]):
        assert att["sys_path"] == plain["sys_path"]


def test_trained_parameters_equal_the_plain_run_bit_for_bit(collide):
    assert_params_bitwise_equal(collide["tmp"])
