"""ddpviz.integrations: the Hugging Face Trainer and PyTorch Lightning callbacks, each run where its
framework is installed (neither is a dependency of ddpviz; skipped with the reason otherwise).

Each script runs as ``ddpviz run -- python train.py`` runs it (the launcher's own child, the
start-up hook on PYTHONPATH); its steps are checked against the framework's own count.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from wtools import REPO

from ddpviz.engine.attach.env import RUN_ID_ENV, SOLO_ENV, SPOOL_ENV, STARTUP_DIR

pytestmark = pytest.mark.slow


def _run_attached(code: str, tmp_path) -> tuple[dict, list[dict]]:
    """`code` as the training process of an attached run; its last stdout line (JSON) and its events."""
    script = tmp_path / "train.py"
    script.write_text(code)
    spool = tmp_path / "spool"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPVIZ_ATTACH")}
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    env.update({RUN_ID_ENV: "0123456789abcdef", SPOOL_ENV: str(spool), SOLO_ENV: str(os.getpid()),
                "PYTHONPATH": os.pathsep.join([str(STARTUP_DIR), str(REPO)])})
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "out")], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    events = [json.loads(line) for f in spool.glob("events-*.jsonl") for line in f.read_text().splitlines()]
    return json.loads(out.stdout.strip().splitlines()[-1]), events


def _steps(events: list[dict]) -> list[dict]:
    return sorted((e for e in events if e["type"] == "step"), key=lambda e: e["step"])


HF = """
import json, sys, torch, torch.nn as nn
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments
from ddpviz.integrations import HuggingFaceCallback

class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x, labels=None):
        out = self.net(x)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}

class Data(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 8, generator=g)
        self.y = self.x.sum(1, keepdim=True)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}

args = TrainingArguments(output_dir=sys.argv[1], max_steps=3, per_device_train_batch_size=8,
                         gradient_accumulation_steps=2, report_to=[], use_cpu=True, save_strategy="no",
                         logging_strategy="no", disable_tqdm=True)
trainer = Trainer(model=Regressor(), args=args, train_dataset=Data(), callbacks=[HuggingFaceCallback(name="hf")])
trainer.train()
print(json.dumps(dict(global_step=trainer.state.global_step)))
"""


def test_huggingface_trainer_steps_are_its_optimizer_steps(tmp_path):
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed (an optional integration, not a dependency of ddpviz)")
    mine, events = _run_attached(HF, tmp_path)
    steps = _steps(events)
    assert mine["global_step"] == 3
    assert [e["step"] for e in steps] == list(range(mine["global_step"]))
    # two accumulated batches of 8 per optimizer step, seen by the watched model's forward
    assert [(e["micro_steps"], e["samples"], e["step_source"]) for e in steps] == [(2, 16, "optimizer")] * 3
    started = [e for e in events if e["type"] == "run_started"]
    assert len(started) == 1 and started[0]["label"] == "hf" and started[0]["config"]["model"] == "Regressor"


LIGHTNING = """
import json, torch, torch.nn as nn
try:
    import lightning.pytorch as pl
except ImportError:  # the standalone `pytorch-lightning` package, which LightningCallback accepts too
    import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset
from ddpviz.integrations import LightningCallback

class Gan(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False  # two optimizers, stepped by hand
        self.g = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
        self.d = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        self.seen = []

    def training_step(self, batch, batch_idx):
        (real,) = batch
        opt_g, opt_d = self.optimizers()
        bce = nn.functional.binary_cross_entropy_with_logits
        fake = self.g(torch.randn(len(real), 4))
        d_loss = bce(self.d(real), torch.ones(len(real), 1)) + bce(self.d(fake.detach()), torch.zeros(len(real), 1))
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        g_loss = bce(self.d(fake), torch.ones(len(real), 1))
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.seen.append([len(real), g_loss.item()])
        return g_loss

    def configure_optimizers(self):
        return [torch.optim.Adam(self.g.parameters(), 1e-3), torch.optim.Adam(self.d.parameters(), 1e-3)]

torch.manual_seed(0)
model = Gan()
trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, callbacks=[LightningCallback(name="gan")])
trainer.fit(model, DataLoader(TensorDataset(torch.randn(40, 8)), batch_size=16))
print(json.dumps(dict(seen=model.seen)))
"""


def test_lightning_manual_optimization_with_two_optimizers_is_one_step_per_batch(tmp_path):
    if importlib.util.find_spec("lightning") is None and importlib.util.find_spec("pytorch_lightning") is None:
        pytest.skip("neither lightning nor pytorch-lightning is installed (an optional integration, "
                    "not a dependency of ddpviz)")
    mine, events = _run_attached(LIGHTNING, tmp_path)
    steps = _steps(events)
    assert [n for n, _ in mine["seen"]] == [16, 16, 8]  # the script's own count: three batches
    assert [e["step"] for e in steps] == [0, 1, 2]  # not one per optimizer step (6)
    assert [e["samples"] for e in steps] == [n for n, _ in mine["seen"]]
    assert [e["loss"] for e in steps] == pytest.approx([loss for _, loss in mine["seen"]], rel=1e-6)
    assert all(e["step_source"] == "explicit" and e["micro_steps"] == 2 for e in steps)
