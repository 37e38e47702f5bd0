"""`ddpviz predict` on recorded real runs in a real Redis: the page's numbers, refusals named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from wtools import cli_env, ddpviz

from engine.predict.presets import LINKS
from workers.scaleout import report, scenario_from
from workers.sink import RedisStreamWriter
from workers.store import RunStatus
from workers.sweeps import submit_trio

DATA = Path(__file__).resolve().parents[1] / "app" / "data"
CONFIG = {"world_size": 2, "steps": 12, "width": 256, "bucket_cap_mb": 0.1, "step_delay_s": 0.0,
          "eval_every": 0}
HOST = {"host_cpu_count": 2, "cpu_threads_per_device": 1}  # what run_started says since the recordings
FILES = {"single": "real_single_mlp_ws2.jsonl", "dp": "real_dp_mlp_ws2.jsonl", "ddp": "real_ddp_mlp_ws2.jsonl",
         "fsdp": "real_fsdp_mlp_ws2.jsonl"}


def _store_trio(client, single_optimizer_scale: float = 1.0, host: dict | None = None) -> dict[str, str]:
    """A single/DP/DDP/FSDP set finished with the recorded runs (as tests/app/recorded.py plays
    them); the single run's optimizer steps scaled by `single_optimizer_scale`, and `host`'s
    fields added to each run_started (the recordings predate host_cpu_count)."""
    _, ids = submit_trio(client, CONFIG)
    for mode, rid in ids.items():
        events = [{**json.loads(line), "run_id": rid} for line in (DATA / FILES[mode]).open() if line.strip()]
        events = [{**e, **(host or {})} if e.get("type") == "run_started" else e for e in events]
        if mode == "single":
            events = [{**e, "optimizer_s": e["optimizer_s"] * single_optimizer_scale}
                      if e.get("type") == "step" else e for e in events]
        client.store.mark_started(rid, "test-worker")
        RedisStreamWriter(client.redis, rid).write_batch(events)
        client.store.finish(rid, RunStatus.SUCCEEDED, summary=events[-1].get("summary"))
    return ids


@pytest.fixture
def recorded_trio(redis_client):
    from workers.client import DdpvizClient

    client = DdpvizClient(redis=redis_client)
    return client, _store_trio(client, host=HOST)


def test_predict_json_gives_the_reports_numbers(recorded_trio, redis_url):
    client, ids = recorded_trio
    res = ddpviz("predict", ids["ddp"], "--world-sizes", "1,2,4,8", "--link", "nvlink-h100", "--json",
                 env=cli_env(redis_url))
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    page = report(client, ids["ddp"], [1, 2, 4, 8], scenario_from("nvlink-h100"))
    assert out["predictions"] == json.loads(json.dumps(page["predictions"]))
    assert {(p["mode"], p["world_size"]) for p in out["predictions"]} == \
        {(m, n) for m in ("dp", "ddp") for n in (1, 2, 4, 8)}
    ddp8 = next(p for p in out["predictions"] if p["mode"] == "ddp" and p["world_size"] == 8)
    assert ddp8["link"]["beta_bytes_per_s"] == LINKS["nvlink-h100"].beta_bytes_per_s
    # validation: the measured side is each run's own summary (medians of its steady steps)
    measured = {v["mode"]: v["measured_samples_per_s"] for v in out["validation"]}
    assert measured == {m: client.get_run(ids[m])["summary"]["samples_per_s"] for m in ("dp", "ddp")}
    assert set(out["calibration"]) == {"single", "dp", "ddp"}
    assert any("NVLink 4" in line and "nccl-tests" in line for line in out["assumptions"])
    # the contention term is read from the trio's DDP rank and single baseline, and said
    assert out["contention"]["source"].startswith("optimizer step of DDP rank")
    cal = out["calibration"]  # world size 2 on 2 cores: no time-share, κ = optimizer ratio
    assert out["contention"]["value"] == pytest.approx(
        max(1.0, cal["ddp"]["optimizer_s"] / cal["single"]["optimizer_s"]))
    assert out["scenario"]["contention"] == out["contention"]["value"]
    assert any("κ" in line and out["contention"]["source"] in line for line in out["assumptions"])


def test_a_gpu_compute_preset_reports_no_contention_term(redis_client):
    from workers.client import DdpvizClient

    client = DdpvizClient(redis=redis_client)
    ids = _store_trio(client, single_optimizer_scale=0.5,  # the baseline's optimizer step halved: κ ~ 2
                      host=HOST)
    # a finished DDP run at world size 1 of the same config: a row where κ matters (u(1) = 1)
    one = client.submit({**CONFIG, "mode": "ddp", "world_size": 1})
    client.store.mark_started(one, "test-worker")
    client.store.finish(one, RunStatus.SUCCEEDED, summary={"samples_per_s": 20_000.0, "step_time_s": 0.0032})
    rep = report(client, ids["ddp"], [1, 2], scenario_from("nvlink-h100", compute_key="h100"))
    assert rep["contention"]["value"] == 1.0 and rep["scenario"]["contention"] == 1.0
    assert rep["contention"]["source"].startswith("not used")
    here = report(client, ids["ddp"], [1, 2], scenario_from())  # the same set, measured compute
    assert here["contention"]["source"].startswith("optimizer step of DDP rank")
    # the table against real runs is this machine's prediction whatever the preset: the same rows
    assert any(v["world_size"] == 1 and v["mode"] == "ddp" for v in here["validation"])
    assert here["contention"]["value"] > 1.0 and rep["validation"] == here["validation"]


def test_predict_table_and_refusals(recorded_trio, redis_url):
    client, ids = recorded_trio
    env = cli_env(redis_url)
    res = ddpviz("predict", ids["dp"], "--world-sizes", "2,4", env=env)
    assert res.returncode == 0, res.stderr
    assert "predicted vs measured on this machine" in res.stdout and "ddp      4" in res.stdout
    res = ddpviz("predict", "nosuchrun", env=env)
    assert res.returncode == 1 and "nosuchrun" in res.stderr
    res = ddpviz("predict", ids["ddp"], "--world-sizes", "0,2", env=env)
    assert res.returncode == 2 and "world sizes" in res.stderr
    res = ddpviz("predict", ids["ddp"], "--world-sizes", "16", "--link", "pcie4", "--devices-per-host", "8",
                 env=env)
    assert res.returncode == 2 and "inter_link" in res.stderr and "Traceback" not in res.stderr
    res = ddpviz("predict", ids["ddp"], "--alpha-s", "1e-6", env=env)
    assert res.returncode == 2 and "beta_bytes_per_s" in res.stderr
