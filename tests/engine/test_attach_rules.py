"""Small rules of the attach path (issue 32.2, 32.5): which forwards are training forwards, and
whose exceptions may go to torchrun's error file."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from ddpviz.engine.attach.errors import install_excepthook, raised_in_ddpviz
from ddpviz.engine.attach.steps import training_forward


class _W:
    def __init__(self, module):
        self.module = module


def test_only_forwards_with_autograd_on_and_the_module_training_are_training_forwards():
    m = torch.nn.Linear(2, 2)
    assert training_forward(_W(m))
    with torch.no_grad():
        assert not training_forward(_W(m))
    with torch.inference_mode():
        assert not training_forward(_W(m))
    m.eval()
    assert not training_forward(_W(m))
    # Lightning after validation: the model back in train(), the DDP wrapper's own flag left False
    wrapper, model = torch.nn.Linear(2, 2).eval(), torch.nn.Linear(2, 2).train()
    lightning = _W(model)
    lightning.ddp = wrapper
    assert training_forward(lightning)


def _exc_from(code: str, filename: str) -> BaseException:
    try:
        exec(compile(code, filename, "exec"), {})
    except BaseException as exc:  # KeyboardInterrupt and SystemExit too
        return exc
    raise AssertionError("no exception")


def test_an_exception_raised_in_ddpviz_never_goes_to_torchruns_error_file(tmp_path, monkeypatch):
    import ddpviz.engine.attach.errors as errors

    ours = _exc_from("raise RuntimeError('ours')", str(errors._OURS / "attach" / "ddp.py"))
    theirs = _exc_from("raise ValueError('bad batch')", str(tmp_path / "train.py"))
    assert raised_in_ddpviz(ours.__traceback__) and not raised_in_ddpviz(theirs.__traceback__)
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    monkeypatch.setattr(sys, "excepthook", lambda *a: None)
    install_excepthook(lambda: 3)
    sys.excepthook(type(ours), ours, ours.__traceback__)
    assert not path.exists()
    sys.excepthook(type(theirs), theirs, theirs.__traceback__)
    doc = json.loads(path.read_text())["message"]
    assert doc["message"] == "ValueError: bad batch" and doc["extraInfo"]["rank"] == 3


def test_a_launchers_child_failed_error_is_written_as_its_first_failing_ranks_exception(tmp_path, monkeypatch):
    """`accelerate launch` runs torch's elastic agent in its own process, with no `@record`: its
    ChildFailedError reached torchrun's error file as the launcher's (rank 0's) exception."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from ddpviz.engine.attach.errors import child_failure, error_payload

    worker_file = tmp_path / "worker1.json"
    worker_file.write_text(json.dumps(error_payload(ValueError("bad batch on rank 1"), 1)))
    failure = ProcessFailure(local_rank=1, pid=4321, exitcode=1, error_file=str(worker_file))
    exc = ChildFailedError("train.py", {1: failure})
    assert child_failure(exc)["message"]["message"] == "ValueError: bad batch on rank 1"
    assert child_failure(ValueError("not a launcher's")) is None
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    monkeypatch.setattr(sys, "excepthook", lambda *a: None)
    install_excepthook(lambda: None)  # the launcher trained nothing
    sys.excepthook(type(exc), exc, None)
    doc = json.loads(path.read_text())["message"]
    assert doc["message"] == "ValueError: bad batch on rank 1" and doc["extraInfo"]["rank"] == 1


def test_a_scripts_traceback_leaves_ddpvizs_wrapper_frames_out_and_ddpvizs_own_error_keeps_them(tmp_path,
                                                                                                  monkeypatch):
    """A Ctrl-C in an attached script's backward printed `engine/attach/__init__.py ... in timed_backward` among
    the script's frames (a new user, 2026-12-06). Reference: the frames of the same exception, ddpviz's left out
    by hand; an error raised in ddpviz itself keeps every frame (it must show where it is)."""
    import traceback

    import ddpviz.engine.attach.errors as errors

    shared: dict = {}
    exec(compile("def wrapper(fn):\n    return fn()\n", str(errors._OURS / "attach" / "__init__.py"), "exec"), shared)
    exec(compile("def train():\n    wrapper(inner)\n\ndef inner():\n    raise ValueError('bad batch')\n",
                 str(tmp_path / "train.py"), "exec"), shared)
    exec(compile("def broken():\n    raise RuntimeError('ours')\n", str(errors._OURS / "attach" / "ddp.py"), "exec"),
         shared)
    got = []
    monkeypatch.setattr(sys, "excepthook", lambda t, e, tb: got.append([f.name for f in traceback.extract_tb(tb)]))
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    install_excepthook(lambda: 0)
    try:
        shared["train"]()
    except ValueError as exc:
        full = [f.name for f in traceback.extract_tb(exc.__traceback__)]
        sys.excepthook(type(exc), exc, exc.__traceback__)
    assert full[1:] == ["train", "wrapper", "inner"]
    assert got[-1] == [n for n in full if n != "wrapper"]
    assert "attach/__init__.py" not in json.loads(path.read_text())["message"]["extraInfo"]["py_callstack"]
    try:
        shared["wrapper"](shared["broken"])
    except RuntimeError as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    assert got[-1][1:] == ["wrapper", "broken"]


def test_an_exception_the_scripts_own_excepthook_took_and_a_ranks_keyboardinterrupt_are_recorded(tmp_path,
                                                                                                 monkeypatch):
    """A script that installs its own `sys.excepthook` after ddpviz bypassed ddpviz's, and its rank's ValueError
    became "exited with code 1, without an exception"; a rank's own KeyboardInterrupt was not recorded either, and
    the peer left waiting was blamed (a new user, 2026-12-06). Python sets `sys.last_value` before it calls
    whatever hook is installed: the at-exit half records it, once."""
    from ddpviz.engine.attach.errors import RANK_ERROR_FILE

    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.setattr(sys, "excepthook", lambda *a: None)
    at_exit = install_excepthook(lambda: 1, tmp_path)
    monkeypatch.setattr(sys, "excepthook", lambda *a: None)  # the script's own crash reporter
    theirs = _exc_from("raise ValueError('boom on rank 1')", str(tmp_path / "train.py"))
    monkeypatch.setattr(sys, "last_value", theirs, raising=False)
    at_exit()
    doc = json.loads((tmp_path / RANK_ERROR_FILE.format(rank=1)).read_text())["message"]
    assert doc["message"] == "ValueError: boom on rank 1" and doc["extraInfo"]["rank"] == 1

    at_exit = install_excepthook(lambda: 2, tmp_path)
    stop = _exc_from("raise KeyboardInterrupt()", str(tmp_path / "train.py"))
    sys.excepthook(type(stop), stop, stop.__traceback__)
    assert json.loads((tmp_path / RANK_ERROR_FILE.format(rank=2)).read_text())["message"]["message"] == \
        "KeyboardInterrupt: "
    exit_ = _exc_from("raise SystemExit(3)", str(tmp_path / "train.py"))  # its own exit code says it
    install_excepthook(lambda: 4, tmp_path)
    sys.excepthook(type(exit_), exit_, exit_.__traceback__)
    assert not (tmp_path / RANK_ERROR_FILE.format(rank=4)).exists()


def test_a_ddps_bucket_cap_reads_as_the_script_gave_it():
    # DDP keeps int(bucket_cap_mb * 1024 * 1024) bytes (torch/nn/parallel/distributed.py): a script's 0.02 read
    # 0.01999950408935547 (a new user, 2026-12-06). Reference: the caps given, through a real DDP.
    import tempfile

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddpviz.engine.modes.ddp.buckets import cap_mb_of

    if dist.is_initialized():
        pytest.skip("a process group exists already")
    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group("gloo", init_method=f"file://{d}/pg", rank=0, world_size=1)
        try:
            for given in (0.02, 0.1, 25.0, 0.001, 1.5, 0.0125, 100.0):
                ddp = DDP(torch.nn.Linear(2, 2), bucket_cap_mb=given)
                assert cap_mb_of(int(ddp.bucket_bytes_cap)) == given
                assert ddp.bucket_bytes_cap / 2**20 != given or given in (25.0, 1.5, 100.0)  # what it read before
        finally:
            dist.destroy_process_group()


def test_a_script_training_its_model_in_eval_mode_is_told_why_no_step_is_recorded(tmp_path):
    """ddpviz records steps from training forwards only (`training_forward`), so a script that trains its DDP's model
    in eval() mode (freezing BatchNorm's statistics that way) was recorded as no step at all, and nothing said why
    (a helper's trial, 2026-12-07). It now says so once, on stderr and as a `log` event. Reference: the same script
    with the model in train() mode, whose 4 steps are recorded without the note."""
    import subprocess

    from ddpviz.engine.attach.steps import EVAL_NOTE

    from tests.engine.attach_process import PREAMBLE

    script = PREAMBLE + r'''
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
ddp = DDP(model)
if sys.argv[2] == "eval":
    model.eval()
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for _ in range(4):
    ddp(torch.randn(16, 8)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
'''
    got = {}
    for mode in ("eval", "train"):
        spool = tmp_path / mode
        spool.mkdir()
        out = subprocess.run([sys.executable, "-c", script, "attached", mode], capture_output=True, text=True,
                             timeout=120, env={"PATH": "/usr/bin:/bin", "DDPVIZ_ATTACH_RUN_ID": "eval",
                                               "DDPVIZ_ATTACH_SPOOL": str(spool), "OMP_NUM_THREADS": "1"})
        assert out.returncode == 0, out.stderr[-3000:]
        events = [json.loads(line) for p in spool.glob("events-*.jsonl") for line in p.read_text().splitlines()]
        got[mode] = (out.stderr.count(EVAL_NOTE), [e["message"] for e in events if e["type"] == "log"],
                     sum(1 for e in events if e["type"] == "step"))
    assert got["eval"] == (1, [EVAL_NOTE], 0), got["eval"]
    assert got["train"] == (0, [], 4), got["train"]
