"""An attached run's `run_started` says whether the script's DDP overlaps its all-reduces with
the backward (`config.overlap`, `config.overlap_source`; engine.attach.started.overlap_of).

It was hard-coded True. References: hand-made bucket records (ready and all-reduce start times
chosen so the answer is known), and two real attached one-rank gloo scripts: plain DDP, whose
reducer hands each bucket to all-reduce when it is ready (True, measured), and one whose comm hook
holds every bucket and all-reduces them together in the last call (not measurable: None).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ddpviz.engine.attach.env import RUN_ID_ENV, SPOOL_ENV, STARTUP_DIR
from ddpviz.engine.attach.started import overlap_of
from ddpviz.engine.components.ports import free_port

REPO = Path(__file__).resolve().parents[2]
HELD = "bucket buffer (DDP's flat gradients, float32 here) (the script's hook handed no tensor to ..."


def _watch(buckets, hook=None):
    return SimpleNamespace(ddp=object(), last_buckets=buckets,
                           state=SimpleNamespace(user_hook=hook))


def _b(ready, start, source="bucket buffer"):
    return {"ready_s": ready, "comm_start_s": start, "nbytes_source": source}


def hold_until_last(state, bucket):  # a script's hook, by name only
    return None


def test_overlap_measured_from_the_buckets_start_times():
    on = overlap_of(_watch([_b(0.010, 0.010), _b(0.020, 0.021), _b(0.030, 0.030)]))
    assert on[0] is True and on[1].startswith("measured: 3 buckets")
    # every all-reduce began once the last bucket (ready at 0.030) was: held, as overlap=false does
    off = overlap_of(_watch([_b(0.010, 0.030), _b(0.020, 0.031), _b(0.030, 0.032)]))
    assert off[0] is False and "never began" in off[1]


def test_overlap_without_two_measured_buckets_comes_from_the_hook_or_is_unknown():
    assert overlap_of(_watch([_b(0.01, 0.01)]))[0] is True  # DDP's own all-reduce, one bucket
    assert overlap_of(_watch([], hook=None))[1].startswith("derived: DDP (no comm hook)")
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

    assert overlap_of(_watch([], hook=fp16_compress_hook))[0] is True
    # the script's own hook whose early buckets called no all_reduce: their starts are stand-ins
    held = [_b(0.01, 0.01, HELD), _b(0.02, 0.02, HELD), _b(0.03, 0.031)]
    value, source = overlap_of(_watch(held, hook=hold_until_last))
    assert value is None and source.startswith("unknown:") and "hold_until_last" in source
    assert overlap_of(SimpleNamespace(ddp=None)) == (None, None)  # FSDP, a watched module: no DDP
    assert overlap_of(None) == (None, None)


SCRIPT = """
import sys, torch, torch.distributed as dist, torch.nn as nn
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(6)])
ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.02)  # 6 layers of 16.6 KB: 3 buckets
if sys.argv[1] == "held":
    held = []

    def hold_until_last(state, bucket):
        fut = torch.futures.Future()
        held.append((bucket.buffer(), fut))
        if bucket.is_last():
            for buf, f in held:
                dist.all_reduce(buf.div_(dist.get_world_size()))
                f.set_result(buf)
            held.clear()
        return fut

    ddp.register_comm_hook(None, hold_until_last)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
for _ in range(3):
    ddp(torch.randn(8, 64)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""


def _attached_run_started(tmp_path: Path, variant: str) -> dict:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    spool = tmp_path / f"spool-{variant}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPVIZ_ATTACH")}
    env.update({RUN_ID_ENV: "r", SPOOL_ENV: str(spool), "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port()), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                "PYTHONPATH": os.pathsep.join([str(STARTUP_DIR), str(REPO)])})
    # one rank is enough: DDP buckets and calls the comm hook at world size 1 too, and the
    # question is when each bucket's all-reduce began, not what it summed
    out = subprocess.run([sys.executable, str(script), variant], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for f in spool.glob("events-*.jsonl") for line in f.read_text().splitlines()]
    (started,) = [e for e in events if e["type"] == "run_started"]
    return started


@pytest.mark.slow
def test_an_attached_scripts_overlap_is_what_its_ddp_did(tmp_path):
    plain = _attached_run_started(tmp_path, "plain")["config"]
    assert plain["overlap"] is True and plain["overlap_source"].startswith("measured: 3 buckets")
    held = _attached_run_started(tmp_path, "held")["config"]
    assert held["overlap"] is None and "hold_until_last" in held["overlap_source"]
