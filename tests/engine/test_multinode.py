"""DDP across two "hosts": two launcher processes meet at one c10d rendezvous (torch elastic).

Each node is a separate OS process running `run_training` with its own NodeSpec, as two workers
on two machines would; they share only the rendezvous endpoint (loopback here).
"""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from engine.config import RunConfig
from engine.events import ListSink, read_jsonl
from engine.modes.launcher import free_port
from engine.run import run_training

pytestmark = pytest.mark.slow
FIELDS = dict(mode="ddp", world_size=2, nnodes=2, width=32, depth=2, global_batch_size=32, steps=4,
              eval_every=0, lr=0.1, optimizer="sgd", bucket_cap_mb=0.005)

NODE = textwrap.dedent("""
    import json, sys, torch
    from engine.config import RunConfig
    from engine.events import JsonlWriter
    from engine.modes.launcher import NodeSpec
    from engine.run import run_training
    fields, endpoint, index, out = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    sink = JsonlWriter(out + ".jsonl")
    node = NodeSpec(nnodes=2, rdzv_endpoint=endpoint, is_host=index == 0, host_label=f"host{index}")
    r = run_training(RunConfig(**fields), sink, "mn", node=node)
    sink.close()
    if r.final_params is not None:
        torch.save(r.final_params, out + ".pt")
    json.dump(dict(status=r.status, error=r.error), open(out + ".json", "w"))
""")


def run_nodes(tmp_path, fields):
    endpoint = f"127.0.0.1:{free_port()}"
    procs = [subprocess.Popen([sys.executable, "-c", NODE, json.dumps(fields), endpoint, str(i),
                               str(tmp_path / f"node{i}")]) for i in range(2)]
    for p in procs:
        assert p.wait(timeout=180) == 0
    return [json.load(open(tmp_path / f"node{i}.json")) for i in range(2)]


def test_two_hosts_train_as_one_ddp_run(tmp_path):
    results = run_nodes(tmp_path, FIELDS)
    assert [r["status"] for r in results] == ["succeeded", "succeeded"], results
    events = read_jsonl(tmp_path / "node0.jsonl") + read_jsonl(tmp_path / "node1.jsonl")
    hosts = {(e["rank"], e["host"]) for e in events if e["type"] == "step"}
    assert {h for _, h in hosts} == {"host0", "host1"} and {r for r, _ in hosts} == {0, 1}
    params = [tmp_path / f"node{i}.pt" for i in range(2) if (tmp_path / f"node{i}.pt").exists()]
    assert len(params) == 1  # only the host of global rank 0 saves them
    single = run_training(RunConfig(**{**FIELDS, "mode": "single", "nnodes": 1}), ListSink(), "s")
    torch.testing.assert_close(torch.load(params[0]), single.final_params, rtol=1e-5, atol=1e-6)


def test_a_failure_on_one_host_ends_the_run_on_both(tmp_path):
    results = run_nodes(tmp_path, {**FIELDS, "steps": 50, "fault": "raise", "fault_rank": 1, "fault_step": 2,
                                   "collective_timeout_s": 10})
    assert [r["status"] for r in results] == ["failed", "failed"]
    assert any("rank 1 raised at step 2" in r["error"]["exception"] for r in results)
