"""Small rules of the attach path (issue 32.2, 32.5): which forwards are training forwards, and
whose exceptions may go to torchrun's error file."""

from __future__ import annotations

import json
import sys

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


def _exc_from(code: str, filename: str) -> BaseException:
    try:
        exec(compile(code, filename, "exec"), {})
    except Exception as exc:
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
