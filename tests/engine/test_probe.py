"""The all-reduce probe for real: 2 gloo ranks through `ddpviz probe`, and inside a DDP run.

References: the event contract (docs/events.md), the nccl-tests busbw formula written out here
(algbw = bytes / time, busbw = algbw · 2(n−1)/n), the ring model written from α and β
(t = 2(n−1)·α + 2(n−1)/n · bytes/β), and the run's own step events (the probe starts after the
last step ends).
"""

import json

import pytest

from ddpviz.engine.config import RunConfig
from ddpviz.engine.events import ListSink
from ddpviz.engine.run import run_training
from ddpviz.workers.cli.commands import main

pytestmark = pytest.mark.slow
PROBE_KEYS = {"type", "run_id", "ts", "rank", "device", "backend", "world_size", "dtype", "iters",
              "warmup_iters", "points", "fit", "source"}
FIT_KEYS = {"alpha_s", "beta_bytes_per_s", "latency_s", "s_per_byte", "points_used"}
DDP = dict(mode="ddp", world_size=2, model="mlp", width=32, depth=2, global_batch_size=16, steps=3,
           eval_every=0, step_delay_s=0.0, bucket_cap_mb=0.005)  # several buckets of ~5 KiB


def _model_s(fit, nbytes, n):
    return 2 * (n - 1) * fit["alpha_s"] + 2 * (n - 1) / n * nbytes / fit["beta_bytes_per_s"]


@pytest.mark.quiet  # the fit judges this link's times: under the suite's load, CI once got no fit
def test_real_two_rank_gloo_probe_fits_its_own_points(capsys):
    with pytest.raises(SystemExit) as done:
        main(["probe", "--world-size", "2", "--json"])  # the defaults a DDP run uses
    assert done.value.code == 0
    ev = json.loads(capsys.readouterr().out)
    assert PROBE_KEYS <= set(ev) and FIT_KEYS <= set(ev["fit"])
    assert (ev["type"], ev["rank"], ev["backend"], ev["world_size"], ev["dtype"]) == \
        ("allreduce_probe", 0, "gloo", 2, "float32")
    sizes = [p["nbytes"] for p in ev["points"]]
    assert sizes == [4096 * 2 ** i for i in range(len(sizes))] and len(sizes) >= 6
    assert sizes + ev["skipped_nbytes"] == [4096 * 2 ** i for i in range(15)]
    for p in ev["points"]:
        assert p["algbw_bytes_per_s"] == pytest.approx(p["nbytes"] / p["time_s"])
        assert p["busbw_bytes_per_s"] == pytest.approx(p["algbw_bytes_per_s"] * 2 * (2 - 1) / 2)
    fit = ev["fit"]
    used = fit["points_used"]
    assert fit["within_tolerance"] and len(used) >= 3  # a range, not a line through two points
    measured = {p["nbytes"]: p["time_s"] for p in ev["points"]}
    for nbytes in used:  # the ring model from α and β predicts the probe's own times
        assert _model_s(fit, nbytes, 2) == pytest.approx(measured[nbytes], rel=0.2), nbytes


def test_probe_event_once_after_training_and_absent_when_off_or_dp():
    sink = ListSink()
    assert run_training(RunConfig(**DDP), sink, "p").status == "succeeded"
    (probe,) = sink.of_type("allreduce_probe")
    assert probe["rank"] == 0 and probe["world_size"] == 2 and probe["backend"] == "gloo"
    assert probe["source"].startswith("measured: standalone all-reduce")
    last_end = max(s["start_ts"] + s["step_time_s"] for s in sink.of_type("step"))
    assert probe["ts"] - probe["wall_s"] >= last_end - 0.01  # began after every rank's last step
    # its budget: a tenth of the training it follows, at least 0.25 s (not the standalone 2 s)
    first_start = min(s["start_ts"] for s in sink.of_type("step"))
    assert 0.25 <= probe["budget_s"] <= max(0.25, 0.1 * (probe["ts"] - probe["wall_s"] - first_start) + 0.05)
    assert [e["type"] for e in sink.events][-1] == "run_finished"
    # the run's own bucket sizes were probed first: every in-run bucket has a probe point of its size
    last = max(b["step"] for b in sink.of_type("bucket"))
    sizes = sorted({b["nbytes"] for b in sink.of_type("bucket") if b["step"] == last})
    assert len(sizes) >= 2 and probe["run_nbytes"] == sizes
    assert set(sizes) <= {p["nbytes"] for p in probe["points"]}

    off = ListSink()
    assert run_training(RunConfig(**DDP, probe=False), off, "q").status == "succeeded"
    assert off.of_type("allreduce_probe") == []
    assert len(off.of_type("step")) == len(sink.of_type("step"))
    dp = ListSink()  # DP has no process group: no probe, whatever the flag says
    assert run_training(RunConfig(**{**DDP, "mode": "dp"}), dp, "r").status == "succeeded"
    assert dp.of_type("allreduce_probe") == []


def test_a_runs_probe_budget_is_a_tenth_of_its_training_within_a_quarter_second_and_two():
    from ddpviz.engine.modes.ddp.probe import run_budget_s

    assert run_budget_s(0.3) == 0.25 and run_budget_s(-1.0) == 0.25  # the floor
    assert run_budget_s(7.0) == pytest.approx(0.7)
    assert run_budget_s(20.0) == 2.0 and run_budget_s(3600.0) == 2.0  # the standalone probe's budget
    assert run_budget_s(3600.0, cap_s=5.0) == 5.0


def test_the_runs_sizes_run_first_whatever_the_budget():
    from ddpviz.engine.modes.ddp.probe import MAX_RUN_SIZES, MIN_SIZES, probe_local, run_sizes

    assert run_sizes([6, 4096, 4096, 0]) == [8, 4096]  # distinct, whole float32 elements
    many = run_sizes(list(range(4, 4 * 40, 4)))
    assert len(many) == MAX_RUN_SIZES and many[0] == 4 and many[-1] == 4 * 39
    # a budget nothing fits: the run's two sizes and the ladder's smallest MIN_SIZES still run
    ev = probe_local(2, budget_s=1e-6, iters=1, warmup_iters=0, run_nbytes=[170_000, 25_000_002])
    got = [p["nbytes"] for p in ev["points"]]
    assert got == sorted([170_000, 25_000_004, *[4096 * 2 ** i for i in range(MIN_SIZES)]])
    assert ev["run_nbytes"] == [170_000, 25_000_004]
    assert ev["skipped_nbytes"] == [4096 * 2 ** i for i in range(MIN_SIZES, 15)]


def test_probe_refusals_name_the_argument(capsys):
    for argv, field in ((["--world-size", "1"], "world_size"), (["--iters", "0"], "iters"),
                        (["--min-bytes", "6"], "min_bytes"), (["--budget-s", "0"], "budget_s")):
        with pytest.raises(SystemExit) as done:
            main(["probe", *argv])
        assert done.value.code == 2
        assert field in capsys.readouterr().err


@pytest.mark.gpu
def test_probe_on_nccl_times_with_cuda_events():
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices (NCCL refuses two ranks on one GPU)")
    sink = ListSink()
    cfg = RunConfig(**{**DDP, "device": "cuda"})
    assert run_training(cfg, sink, "g").status == "succeeded"
    (probe,) = sink.of_type("allreduce_probe")
    assert probe["backend"] == "nccl" and probe["device"] == "cuda:0"
    for p in probe["points"]:
        assert p["time_s"] > 0
        assert p["busbw_bytes_per_s"] == pytest.approx(p["nbytes"] / p["time_s"])  # n = 2
