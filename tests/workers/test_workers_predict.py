"""`ddpviz predict` on recorded real runs in a real Redis: the page's numbers, refusals named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from wtools import cli_env, ddpviz

from ddpviz.engine.predict.presets import LINKS
from ddpviz.workers.scaleout import report, scenario_from
from ddpviz.workers.sink import RedisStreamWriter
from ddpviz.workers.store import RunStatus
from ddpviz.workers.sweeps import submit_trio

DATA = Path(__file__).resolve().parents[1] / "app" / "data"
CONFIG = {"world_size": 2, "steps": 12, "width": 256, "bucket_cap_mb": 0.1, "step_delay_s": 0.0,
          "eval_every": 0}
HOST = {"host_cpu_count": 2, "cpu_threads_per_device": 1}  # what run_started says since the recordings
FILES = {"single": "real_single_mlp_ws2.jsonl", "dp": "real_dp_mlp_ws2.jsonl", "ddp": "real_ddp_mlp_ws2.jsonl",
         "fsdp": "real_fsdp_mlp_ws2.jsonl"}


def _store_trio(client, single_optimizer_scale: float = 1.0, host: dict | None = None,
                edit=lambda mode, e: e) -> dict[str, str]:
    """A single/DP/DDP/FSDP set finished with the recorded runs (as tests/app/recorded.py plays
    them); the single run's optimizer steps scaled by `single_optimizer_scale`, `host`'s
    fields added to each run_started (the recordings predate host_cpu_count), and each event passed
    through `edit(mode, event)` (None: left out)."""
    _, ids = submit_trio(client, CONFIG)
    for mode, rid in ids.items():
        events = [{**json.loads(line), "run_id": rid} for line in (DATA / FILES[mode]).open() if line.strip()]
        events = [e for e in (edit(mode, e) for e in events) if e is not None]
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
    from ddpviz.workers.client import DdpvizClient

    client = DdpvizClient(redis=redis_client)
    return client, _store_trio(client, host=HOST)


def _steady_median(mode: str, key: str) -> float:
    """The median of `key` over a recorded run's steady steps, worked here from the file: 12
    steps, the first 3 skipped (warm-up); memory-traced steps (the instrument's work) would be
    left out while half remain, but these recordings traced every step, so steps 3-11 all count;
    a DDP step's value is the mean over its ranks."""
    import statistics
    from collections import defaultdict

    by_step, traced = defaultdict(list), set()
    for line in (DATA / FILES[mode]).open():
        e = json.loads(line) if line.strip() else {}
        if e.get("type") == "step" and e["step"] >= 3:
            by_step[e["step"]].append(e[key])
            if e.get("memory_traced"):
                traced.add(e["step"])
    assert len(by_step) == 9 and len(traced) == 9
    return statistics.median(sum(v) / len(v) for v in by_step.values())


def test_predict_json_gives_the_reports_numbers(recorded_trio, redis_url):
    client, ids = recorded_trio
    env = cli_env(redis_url)
    res = ddpviz("predict", ids["ddp"], "--world-sizes", "1,2,4,8", "--link", "nvlink-h100", "--json", env=env)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert {(p["mode"], p["world_size"]) for p in out["predictions"]} == \
        {(m, n) for m in ("dp", "ddp") for n in (1, 2, 4, 8)}
    ddp8 = next(p for p in out["predictions"] if p["mode"] == "ddp" and p["world_size"] == 8)
    assert ddp8["link"]["beta_bytes_per_s"] == LINKS["nvlink-h100"].beta_bytes_per_s
    # validation: only the runs this test stored, each the calibration set's: all in the fit
    by_run = {v["run_id"]: v for v in out["validation"]}
    assert set(by_run) == {ids["dp"], ids["ddp"]} and all(v["in_fit"] for v in by_run.values())
    assert set(out["calibration_runs"]) == {ids["single"], ids["dp"], ids["ddp"]}
    assert out["out_of_sample"]["runs"] == 0 and out["out_of_sample"]["in_fit"] == 2
    assert {m: by_run[ids[m]]["measured_samples_per_s"] for m in ("dp", "ddp")} == \
        {m: client.get_run(ids[m])["summary"]["samples_per_s"] for m in ("dp", "ddp")}
    assert any("NVLink 4" in line and "nccl-tests" in line for line in out["assumptions"])
    # κ from the recorded DDP ranks' and single baseline's optimizer steps, worked from the files
    # (world size 2 on 2 cores: no time-share, κ = the ratio)
    kappa = max(1.0, _steady_median("ddp", "optimizer_s") / _steady_median("single", "optimizer_s"))
    assert out["contention"]["value"] == pytest.approx(kappa, rel=1e-9)
    assert out["contention"]["source"].startswith("optimizer step of DDP rank")
    assert out["scenario"]["contention"] == out["contention"]["value"]
    assert any("κ" in line and out["contention"]["source"] in line for line in out["assumptions"])
    # a run outside the fit is the one the error is reported on, in the table and the JSON
    four = client.submit({**CONFIG, "mode": "ddp", "world_size": 4})
    client.store.mark_started(four, "test-worker")
    client.store.finish(four, RunStatus.SUCCEEDED, summary={"samples_per_s": 10_000.0, "step_time_s": 0.0096})
    out = json.loads(ddpviz("predict", ids["ddp"], "--json", env=env).stdout)
    (v,) = [v for v in out["validation"] if not v["in_fit"]]
    assert v["run_id"] == four and v["measured_step_time_s"] == 0.0096
    assert out["out_of_sample"]["runs"] == 1 and out["out_of_sample"]["step_time_error_pct"]["max_abs"] == \
        pytest.approx(abs(v["predicted_step_time_s"] - 0.0096) / 0.0096 * 100)
    table = ddpviz("predict", ids["ddp"], env=env).stdout
    assert "out of sample: 1 run(s)" in table and "in the fit: calibration" in table


def test_a_gpu_compute_preset_reports_no_contention_term(redis_client):
    from ddpviz.workers.client import DdpvizClient

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
    # the runs the model was fitted to, by id: asked for the single run, it names its set's DP and DDP
    assert f"calibrated on DP {ids['dp']} and DDP {ids['ddp']} and the single baseline {ids['single']})" in res.stdout
    res = ddpviz("predict", ids["single"], "--world-sizes", "2", env=env)
    assert res.returncode == 0 and f"and the single baseline {ids['single']}; " not in res.stdout
    assert f"calibrated on DP {ids['dp']} and DDP {ids['ddp']} and the single baseline {ids['single']})" in res.stdout
    res = ddpviz("predict", "nosuchrun", env=env)
    assert res.returncode == 1 and "nosuchrun" in res.stderr
    res = ddpviz("predict", ids["ddp"], "--world-sizes", "0,2", env=env)
    assert res.returncode == 2 and "world sizes" in res.stderr
    res = ddpviz("predict", ids["ddp"], "--world-sizes", "16", "--link", "pcie4", "--devices-per-host", "8",
                 env=env)
    assert res.returncode == 2 and "inter_link" in res.stderr and "Traceback" not in res.stderr
    res = ddpviz("predict", ids["ddp"], "--alpha-s", "1e-6", env=env)
    assert res.returncode == 2 and "beta_bytes_per_s" in res.stderr


def test_a_preset_link_predicts_where_this_machine_has_no_link_fit_and_the_check_says_why(redis_client):
    """A DDP run with nothing to fit this machine's link on (no probe event, no timed bucket: a sweep's run,
    bucket_timing=recorder): this machine's link is refused naming the field, a preset link predicts, and the
    check against real runs (always this machine's link) is reported as not made, with the reason, instead
    of taking the predictions down."""
    from ddpviz.workers.client import DdpvizClient

    def no_link(mode, e):
        if mode == "ddp" and e.get("type") == "probe":
            return None
        return {**e, "comm_start_s": None, "comm_end_s": None} if e.get("type") == "bucket" else e

    client = DdpvizClient(redis=redis_client)
    ids = _store_trio(client, host=HOST, edit=no_link)
    with pytest.raises(ValueError, match="link: this machine's link needs a DDP run"):
        report(client, ids["ddp"], [1, 2, 4], scenario_from())
    rep = report(client, ids["ddp"], [1, 2, 4], scenario_from("pcie4"))
    assert {(p["mode"], p["world_size"]) for p in rep["predictions"]} >= {("ddp", 1), ("ddp", 2), ("ddp", 4)}
    assert rep["validation"] == [] and rep["validation_not_checked"].startswith("link: this machine's link")
