"""The all-reduce probe for real: 2 gloo ranks through `ddpviz probe`, and inside a DDP run.

References: the event contract (docs/events.md), the nccl-tests busbw formula written out here
(algbw = bytes / time, busbw = algbw · 2(n−1)/n), the ring model written from α and β
(t = 2(n−1)·α + 2(n−1)/n · bytes/β), and the run's own step events (the probe starts after the
last step ends). The fit's outcomes are tested on constructed points: a clean line, the shape a
loaded CI host gave (a latency plateau, then a change of regime), outliers everywhere, no signal.
"""

import json
import random

import pytest

from ddpviz.engine.analysis import fit_ring_times, probe_fit, probe_no_fit_reason, probe_point
from ddpviz.engine.modes.ddp.probe import probe_event_fields, probe_sizes

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


@pytest.mark.quiet  # judges this link's times within the 2 s budget: the suite's load cuts the ladder short
def test_real_two_rank_gloo_probe_fits_its_own_points(capsys):
    with pytest.raises(SystemExit) as done:
        main(["probe", "--world-size", "2", "--json"])  # the defaults a DDP run uses
    assert done.value.code == 0
    ev = json.loads(capsys.readouterr().out)
    assert PROBE_KEYS <= set(ev)
    assert (ev["type"], ev["rank"], ev["backend"], ev["world_size"], ev["dtype"]) == \
        ("allreduce_probe", 0, "gloo", 2, "float32")
    sizes = [p["nbytes"] for p in ev["points"]]
    assert sizes == [4096 * 2 ** i for i in range(len(sizes))] and len(sizes) >= 6
    assert sizes + ev["skipped_nbytes"] == [4096 * 2 ** i for i in range(15)]
    for p in ev["points"]:
        assert p["algbw_bytes_per_s"] == pytest.approx(p["nbytes"] / p["time_s"])
        assert p["busbw_bytes_per_s"] == pytest.approx(p["algbw_bytes_per_s"] * 2 * (2 - 1) / 2)
    fit = ev["fit"]
    assert fit is not None, (ev["fit_note"], [(p["nbytes"], p["time_s"]) for p in ev["points"]])
    assert FIT_KEYS <= set(fit) and ev["fit_note"] is None
    used = fit["points_used"]
    assert len(used) >= 3  # a range, not a line through two points
    measured = {p["nbytes"]: p["time_s"] for p in ev["points"]}
    misses = [abs(_model_s(fit, b, 2) / measured[b] - 1) for b in used]  # the ring model from α and β
    assert max(misses) == pytest.approx(fit["max_rel_residual"], rel=1e-6)
    assert fit["within_tolerance"] == (fit["method"] == "range")
    if fit["within_tolerance"]:  # the range's line predicts each of its sizes within 20%
        assert max(misses) <= 0.2


def _line(alpha, beta, sizes, n=2, scale=lambda i: 1.0):
    """Probe points on the ring model t = 2(n−1)·α + 2(n−1)/n · bytes/β, point i times scale(i)."""
    return [probe_point(b, (2 * (n - 1) * alpha + 2 * (n - 1) / n * b / beta) * scale(i), n)
            for i, b in enumerate(sizes)]


def test_fit_outcome_clean_line_gives_alpha_and_beta_back():
    fit = probe_fit(_line(30e-6, 5e9, probe_sizes(), n=4), 4)
    assert (fit["method"], fit["within_tolerance"], fit["points_used"]) == ("range", True, probe_sizes())
    assert fit["alpha_s"] == pytest.approx(30e-6, rel=1e-6)
    assert fit["beta_bytes_per_s"] == pytest.approx(5e9, rel=1e-6)
    assert fit["max_rel_residual"] == pytest.approx(0, abs=1e-9)


def test_fit_outcome_latency_plateau_then_a_regime_change_keeps_the_bandwidth_range():
    """The shape of the CI failure (fit None): eight small sizes on a flat plateau (times falling
    a little, so their line has c = 0, β infinite) and a protocol switch at 1 MiB, so no line runs
    through both halves. The plateau was the widest range one line holds and gave no β; the range
    that measures bandwidth (800 µs + bytes / 1.31 GB/s, by hand) must win."""
    us = [500, 480, 470, 460, 470, 455, 450, 450, 1600, 2400, 4000, 7200, 13600]
    pts = [probe_point(4096 * 2 ** i, t * 1e-6, 2) for i, t in enumerate(us)]
    fit = probe_fit(pts, 2)
    assert fit["method"] == "range" and fit["within_tolerance"]
    assert fit["points_used"] == [2 ** 20 * 2 ** i for i in range(5)]
    assert fit["latency_s"] == pytest.approx(800e-6, rel=1e-6)
    assert fit["beta_bytes_per_s"] == pytest.approx(2 ** 20 / 800e-6, rel=1e-6)  # 800 µs more per MiB


def test_fit_outcome_outliers_everywhere_fall_back_to_theil_sen():
    """Every third size three times too slow: no three neighbouring sizes lie on one line, so no
    range qualifies; the Theil-Sen line recovers α and β within 5% where the relative least squares
    over the same points misses β by more than 10% (13% with this seed)."""
    rng = random.Random(3)
    pts = _line(150e-6, 1e9, probe_sizes(),
                scale=lambda i: (3 if i % 3 == 2 else 1) * (1 + rng.uniform(-0.03, 0.03)))
    fit = probe_fit(pts, 2)
    assert (fit["method"], fit["within_tolerance"], fit["points_used"]) == ("theil_sen", False, probe_sizes())
    assert fit["alpha_s"] == pytest.approx(150e-6, rel=0.05)
    assert fit["beta_bytes_per_s"] == pytest.approx(1e9, rel=0.05)
    lsq = fit_ring_times(((p["nbytes"], p["time_s"]) for p in pts), 2)
    assert abs(lsq["beta_bytes_per_s"] / 1e9 - 1) > 0.1


def test_fit_outcome_no_signal_says_so_and_what_to_do():
    """Six small sizes near 400 µs, 3% more a size, ±5% (a budget that stopped at 128 KiB on a slow
    link): every line through them has a byte term under 20% of the time (Theil-Sen's: 49 of 458
    µs at 128 KiB, a β of 2.7 GB/s read from noise), so no fit, and the event says why and which
    flags probe further."""
    flat = _line(400e-6, 1e30, probe_sizes()[:6], scale=lambda i: (1 + 0.03 * i) * (1 + 0.05 * (-1) ** i))
    assert probe_fit(flat, 2) is None
    result = dict(points=flat, world_size=2, iters=10, warmup_iters=3, skipped_nbytes=[], run_nbytes=[],
                  budget_s=0.25, wall_s=0.2)
    fields = probe_event_fields(result, "gloo")
    assert fields["fit"] is None
    assert fields["fit_note"].startswith("not enough signal") and "--max-bytes" in fields["fit_note"]
    one = flat[:1]
    assert probe_fit(one, 2) is None and probe_no_fit_reason(one).startswith("not enough sizes")
    fitted = {**result, "points": _line(50e-6, 1e9, probe_sizes()[:6])}  # 24 µs of bytes at 128 KiB > 20%
    assert probe_event_fields(fitted, "gloo")["fit_note"] is None


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
