"""What the predictor reads from a run's events, on hand-built events with known answers."""

import pytest

from ddpviz.engine.predict.inputs import PredictInputError, measure_run
from ddpviz.engine.predict.presets import compute
from ddpviz.engine.predict.scaleout import (Scenario, compute_contention, contention, fixed_fraction, predict, predict_ddp,
                                            predict_dp, validate)

MS = 1e-3


def _started(mode="ddp", n=2, **kw):
    return dict(type="run_started", run_id="r1", mode=mode, world_size=n, backend="gloo" if mode == "ddp" else None,
                config=dict(mode=mode, world_size=n, global_batch_size=64, model="mlp", optimizer="sgd",
                            overlap=True), devices=[dict(kind="cpu")] * n, emulated=mode == "dp",
                param_count=250_000, grad_bytes=1_000_000, host_cpu_count=2, cpu_threads_per_device=1,
                device_names=[f"cpu:{i}" for i in range(n)], **kw)


def _ddp_events(steps=8, exposed=1 * MS, probe=None):
    """Two ranks; each step: forward 1 ms, backward 4 ms, optimizer 0.5 ms, other 0.5 ms;
    buckets of 0.3 MB ready at 1 ms and 0.7 MB at 4 ms, all-reduces 1->2 ms and 4->5 ms."""
    ev = [_started()] + ([probe] if probe else [])
    for s in range(steps):
        for rank in (0, 1):
            ev.append(dict(type="bucket", step=s, rank=rank, bucket_index=0, nbytes=300_000, ready_s=1 * MS,
                           comm_start_s=1 * MS, comm_end_s=2 * MS))
            ev.append(dict(type="bucket", step=s, rank=rank, bucket_index=1, nbytes=700_000, ready_s=4 * MS,
                           comm_start_s=4 * MS, comm_end_s=4 * MS + exposed))
            ev.append(dict(type="step", step=s, rank=rank, samples=64, forward_s=1 * MS, backward_s=4 * MS,
                           comm_exposed_s=exposed, optimizer_s=0.5 * MS,
                           step_time_s=(6 * MS + exposed), samples_per_s=64 / (6 * MS + exposed)))
    return ev


def test_ddp_inputs_recover_the_step_split_buckets_and_link():
    r = measure_run(_ddp_events())
    assert (r.forward_s, r.backward_s, r.optimizer_s) == pytest.approx((1 * MS, 4 * MS, 0.5 * MS))
    assert r.other_s == pytest.approx(0.5 * MS) and r.comm_exposed_s == pytest.approx(1 * MS)
    assert [(b["nbytes"], b["ready_frac"]) for b in r.buckets] == [(300_000, 0.25), (700_000, 1.0)]
    assert r.comm_busy_s == pytest.approx(2 * MS)
    assert r.steps_used == 6  # 8 steps, the first 2 (a quarter) skipped as warm-up
    # buckets of two sizes that ran alone, both 1 ms: slope 0 -> no line; median busbw, alpha 0
    assert r.link_fit["alpha_s"] == 0.0 and "no line" in r.link_fit["source"]
    assert r.link_fit["beta_bytes_per_s"] == pytest.approx(500_000 / 1e-3)  # median of 0.3 and 0.7 MB/ms


def test_the_probe_wins_over_the_buckets():
    probe = dict(type="allreduce_probe", rank=0, backend="gloo", world_size=2, dtype="float32", iters=5,
                 warmup_iters=1, points=[], source="measured: probe",
                 fit=dict(alpha_s=20e-6, beta_bytes_per_s=2e9, latency_s=40e-6, s_per_byte=5e-10,
                          points_used=[4096, 65536]))
    r = measure_run(_ddp_events(probe=probe))
    assert r.link_fit["alpha_s"] == 20e-6 and r.link_fit["beta_bytes_per_s"] == 2e9
    assert "probe" in r.link_fit["source"]


def test_this_machine_scales_the_measured_all_reduce_with_the_ring():
    # out of sample only: measured at n = 2, predicted at n = 3 (at n = 2 the model gives back its
    # own inputs, which tests nothing)
    r = measure_run(_ddp_events())
    # with alpha = 0 each all-reduce grows by 2(n-1)/n: x4/3 at n=3 (and x1.5 time-share on
    # 2 cores); b1: 4*1.5 = 6 ms -> 6 + 1.333*1.5 ms; exposed = 2 ms
    at_3 = predict_ddp(r, 3, Scenario(fixed_fraction=1.0))
    assert at_3["comm_exposed_s"] == pytest.approx(4 / 3 * 1.5 * MS, rel=1e-6)


def _dp_events():
    ev = [_started("dp")]
    spans = [("broadcast", 0, 0.0, 0.3), ("broadcast", 1, 0.0, 0.25), ("forward", 0, 0.3, 1.3),
             ("forward", 1, 0.4, 1.5), ("loss", 0, 1.4, 1.6), ("reduce", 0, 1.6, 2.1), ("reduce", 1, 1.6, 1.85),
             ("optimizer", 0, 2.1, 2.5)]
    for s in range(4):
        ev.append(dict(type="step", step=s, rank=0, samples=64, forward_s=1 * MS, backward_s=0.2 * MS,
                       comm_exposed_s=0.8 * MS, optimizer_s=0.4 * MS, step_time_s=2.8 * MS,
                       samples_per_s=64 / 2.8e-3))
        for phase, dev, a, b in spans:
            ev.append(dict(type="dp_phase", step=s, phase=phase, device=f"cpu:{dev}", start_s=a * MS,
                           end_s=b * MS, nbytes=1_000_000 if phase in ("broadcast", "reduce") else 0))
    return ev


def test_dp_inputs_recover_hub_spans_and_dispatch():
    ev = _dp_events()
    r = measure_run(ev)
    ph = r.dp_phases
    assert ph["broadcast"]["hub_s"] == pytest.approx(0.3 * MS)
    assert ph["broadcast"]["copy_s"] == pytest.approx(0.25 * MS)
    assert ph["reduce"]["bytes_per_copy"] == 1_000_000
    # the slowest replica: device 1's 1.1 ms; wall: first start 0.3 to last end 1.5
    assert ph["forward"]["wall_s"] == pytest.approx(1.2 * MS) and ph["forward"]["device_s"] == pytest.approx(1.1 * MS)
    # other = step 2.8 - walls (0.3 + 1.2 + 0.2 + 0.5 + 0.4 = 2.6)
    assert ph["other"]["wall_s"] == pytest.approx(0.2 * MS)


def test_fixed_fraction_from_two_forward_passes_by_hand():
    """Single: forward 3 ms over 64 samples; a DDP rank: 2 ms over 32. c(b) = 1 ms + b/32 ms,
    so at 32 samples half of the forward is fixed."""
    run = measure_run(_ddp_events())
    run.forward_s = 2 * MS
    single = measure_run(_ddp_events())
    single.mode, single.world_size, single.forward_s = "single", 1, 3 * MS
    f, source = fixed_fraction(single, run)
    assert f == pytest.approx(0.5) and "50%" in source
    assert fixed_fraction(None, run)[0] == 0.0


def test_a_baseline_not_used_says_what_sets_it_apart():
    run = measure_run(_ddp_events())
    single = _single()
    single.cpu_threads_per_device = (run.cpu_threads_per_device or 1) + 1
    f, source = fixed_fraction(single, run)
    assert f == 0.0 and (f"{single.cpu_threads_per_device} CPU thread(s) a device against this run's "
                         f"{run.cpu_threads_per_device}") in source and "global batch" not in source
    single.cpu_threads_per_device, single.global_batch_size = run.cpu_threads_per_device, run.global_batch_size * 2
    assert f"global batch {run.global_batch_size * 2} against {run.global_batch_size}" in fixed_fraction(single, run)[1]


def _single(optimizer_s=0.4 * MS, forward_s=3 * MS):
    single = measure_run(_ddp_events())
    single.mode, single.world_size, single.run_id = "single", 1, "s1"
    single.optimizer_s, single.forward_s = optimizer_s, forward_s
    return single


def test_contention_is_the_ranks_optimizer_step_over_the_baselines_by_hand():
    """The rank's optimizer step 0.5 ms beside another rank, the baseline's 0.4 ms alone: 1.25."""
    run = measure_run(_ddp_events())
    k, source = contention(_single(), run)
    assert k == pytest.approx(1.25) and "1.25" in source
    assert contention(_single(optimizer_s=0.6 * MS), run)[0] == 1.0  # faster beside others: noise, clipped
    assert contention(None, run)[0] == 1.0
    run.host_cpu_count = None  # an older recording: κ could not be applied, so none is read
    assert contention(_single(), run)[0] == 1.0
    run.host_cpu_count = 2
    dp = measure_run(_ddp_events())
    dp.mode = "dp"
    assert contention(_single(), dp)[0] == 1.0  # DP's optimizer runs on device 0 alone: no reading


def test_contention_leaves_out_the_time_share_of_ranks_that_outnumber_the_cores():
    """4 ranks on 2 cores, 1 thread each: they time-share (k = 2), which the model applies on
    its own; a rank's optimizer step of 1.0 ms against the baseline's 0.4 ms alone is
    2 x 1.25: κ = 1.25, not 2.5."""
    run = measure_run(_ddp_events())
    run.world_size, run.optimizer_s = 4, 1.0 * MS
    k, source = contention(_single(), run)
    assert k == pytest.approx(1.25) and "time-share 2" in source


def test_contention_touches_neither_dp_nor_a_gpu_preset():
    dp = measure_run(_dp_events())
    for n in (1, 2, 3):
        assert predict_dp(dp, n, Scenario(contention=1.25))["step_time_s"] == \
            predict_dp(dp, n, Scenario())["step_time_s"]
    r = measure_run(_ddp_events())
    gpu = compute("h100")
    assert predict_ddp(r, 1, Scenario(compute=gpu, contention=1.25))["step_time_s"] == \
        predict_ddp(r, 1, Scenario(compute=gpu))["step_time_s"]
    with pytest.raises(ValueError, match="contention"):
        predict({"ddp": r}, [1], Scenario(contention=float("inf")))


def test_fixed_fraction_takes_the_rank_alone():
    """The rank's forward 2.5 ms beside another at κ = 1.25 is 2 ms alone; with the baseline's 3 ms
    over 64 samples that is the line of the by-hand test above: f = 0.5."""
    run = measure_run(_ddp_events())
    run.forward_s = 2.5 * MS
    assert fixed_fraction(_single(), run, 1.25)[0] == pytest.approx(0.5)
    # without κ the line runs through 2.5 ms at 32 and 3 ms at 64: c0 = 2 ms, f = 0.8 (overstated)
    assert fixed_fraction(_single(), run)[0] == pytest.approx(0.8)


def test_a_rank_alone_sheds_the_contention_and_more_ranks_keep_it():
    """κ = 1.25 measured at n = 2: at n = 1 the rank's compute, optimizer and other time are
    /1.25 (forward 0.8, backward 3.2, optimizer 0.4, other 0.4 ms, no comm: 4.8 ms); at n = 3
    the ranks are beside others as at n = 2, so κ changes nothing there."""
    r = measure_run(_ddp_events())
    one = predict_ddp(r, 1, Scenario(fixed_fraction=1.0, contention=1.25))
    assert one["step_time_s"] == pytest.approx(4.8 * MS, rel=1e-6)
    assert predict_ddp(r, 1, Scenario(fixed_fraction=1.0))["step_time_s"] == pytest.approx(6 * MS, rel=1e-6)
    three = [predict_ddp(r, 3, Scenario(fixed_fraction=1.0, contention=c))["step_time_s"] for c in (1.0, 1.25)]
    assert three[0] == pytest.approx(three[1], rel=1e-9)
    with pytest.raises(ValueError, match="contention"):
        predict({"ddp": r}, [1], Scenario(contention=0.9))


def test_validate_reports_the_error_in_percent():
    r = measure_run(_ddp_events())
    rows = predict({"ddp": r}, [2], Scenario(fixed_fraction=1.0))
    out = validate(rows, [dict(run_id="m", mode="ddp", world_size=2, step_time_s=8 * MS, samples_per_s=8000.0)])
    assert out[0]["step_time_error_pct"] == pytest.approx(100 * (7 - 8) / 8, rel=1e-6)
    assert out[0]["samples_per_s_error_pct"] == pytest.approx(100 * (64 / 7e-3 - 8000) / 8000, rel=1e-6)


def test_bad_input_is_named():
    with pytest.raises(PredictInputError, match="run_started"):
        measure_run([dict(type="step", step=0)])
    with pytest.raises(PredictInputError, match="step events"):
        measure_run([_started()])
    with pytest.raises(ValueError, match="world_sizes"):
        predict({"ddp": measure_run(_ddp_events())}, [0], Scenario())
    with pytest.raises(ValueError, match="utilisation"):
        predict({"ddp": measure_run(_ddp_events())}, [2], Scenario(utilisation=0))


def test_calibration_keeps_the_steps_the_runs_summary_keeps():
    """One rule for a run's steady steps (issue 20, item 2): 20 single-device steps, the first 3
    warm-up, steps 10 and 19 traced (their time includes the instrument: 50 ms). Worked by hand:
    steps 3-18 but 10 remain, 15 steps; their step times are 10 + s/100 ms, median at step 11
    (the 8th of 3..9, 11..18) = 10.11 ms. Counting the traced steps would give 16 or 17 and
    another median; the run's own summary (SummaryBuilder) must say the same."""
    from ddpviz.engine.summary import SummaryBuilder

    ev = [_started("single", 1)]
    for s in range(20):
        traced = s < 3 or s in (10, 19)
        t = 50 * MS if traced else (10 + s / 100) * MS
        ev.append(dict(type="step", step=s, rank=0, samples=64, forward_s=t / 2, backward_s=t / 4,
                       comm_exposed_s=0.0, optimizer_s=t / 8, step_time_s=t, samples_per_s=64 / t,
                       memory_traced=traced, loss=1.0))
    r = measure_run(ev)
    assert r.steps_used == 15 and r.step_time_s == pytest.approx(10.11 * MS)
    builder = SummaryBuilder()
    for e in ev:
        builder.observe(e)
    assert builder.summary()["step_time_s"] == pytest.approx(r.step_time_s)


def test_bucket_layout_interleaves_two_ddps_buckets_in_launch_order():
    from ddpviz.engine.predict.inputs import bucket_layout

    # one backward of 10 ms: D (ddp 1) has buckets ready at 2 and 6 ms, G (ddp 0) at 4 and 10 ms.
    # Launch order: D0 (0.2), G0 (0.4), D1 (0.6), G1 (1.0) by ready fraction of the last (10 ms).
    def b(ddp, idx, ready, nbytes):
        return dict(type="bucket", step=3, rank=0, ddp_index=ddp, bucket_index=idx, nbytes=nbytes,
                    ready_s=ready, comm_start_s=ready, comm_end_s=ready + 0.001)
    got = bucket_layout([b(0, 0, 0.004, 10), b(0, 1, 0.010, 11), b(1, 0, 0.002, 20), b(1, 1, 0.006, 21)])
    assert [(x["bucket_index"], x["nbytes"]) for x in got] == [(0, 20), (1, 10), (2, 21), (3, 11)]
    assert [x["ready_frac"] for x in got] == pytest.approx([0.2, 0.4, 0.6, 1.0])
    # one DDP: bucket order kept, even where a later bucket was ready first
    one = bucket_layout([b(0, 0, 0.004, 10), b(0, 1, 0.003, 11), b(0, 2, 0.010, 12)])
    assert [x["nbytes"] for x in one] == [10, 11, 12]


def test_the_links_source_says_where_the_probes_model_is_extrapolated():
    """The probe's line fitted on 4-64 MiB; the run's buckets (0.3 and 0.7 MB) lie below it: the source says
    so, with the probe's own time at the nearest size (512 KiB: 0.5 ms) against the model's, by hand
    1.858 ms + 524,288 B x 0.623 ns/B = 2.185 ms. Fitted over the buckets' sizes instead: nothing added."""
    pts = [dict(nbytes=n, time_s=t) for n, t in ((131072, 0.3e-3), (524288, 0.5e-3), (4 << 20, 4.5e-3))]
    fit = dict(alpha_s=928.9e-6, beta_bytes_per_s=1.604e9, latency_s=1.858e-3, s_per_byte=0.623e-9,
               points_used=[4 << 20, 64 << 20])
    probe = dict(type="allreduce_probe", rank=0, backend="gloo", world_size=2, dtype="float32", iters=5,
                 warmup_iters=1, points=pts, source="measured: probe", fit=fit)
    src = measure_run(_ddp_events(probe=probe)).link_fit["source"]
    assert "fitted to 2 sizes (4.00 MiB–64.0 MiB)" in src and "extrapolated" in src
    assert "(at 512 KiB the probe measured 0.5 ms, the model says 2.18 ms)" in src
    fit["points_used"] = [131072, 4 << 20]
    src = measure_run(_ddp_events(probe=probe)).link_fit["source"]
    assert "(128 KiB–4.00 MiB)" in src and "extrapolated" not in src


def test_compute_contention_puts_the_one_device_forward_on_the_baselines_where_f_is_clipped():
    """The case a real 2-core run gave (2026-12-06): the rank's forward 4 ms over 32 samples, the baseline's
    3 ms over 64, the optimizer 0.5 ms against 0.4 (κ = 1.25). ÷ κ the rank's forward is 3.2 ms at half the
    batch: slower than the baseline's whole batch, so f is clipped to 1, and with κ alone the one-device
    forward would be 3.2 ms where the baseline measured 3 ms. κ_c = 4 / 3 puts it on the baseline's 3 ms."""
    run = measure_run(_ddp_events())
    run.forward_s = 4 * MS
    k = contention(_single(), run)[0]
    f = fixed_fraction(_single(), run, k)[0]
    assert (k, f) == (pytest.approx(1.25), 1.0)
    k_c, source = compute_contention(_single(), run, k, f)
    assert k_c == pytest.approx(4 / 3) and "κ_c = 1.33" in source
    one = predict_ddp(run, 1, Scenario(fixed_fraction=f, contention=k, compute_contention=k_c))
    assert one["forward_s"] == pytest.approx(3 * MS)  # the baseline's measured forward
    assert one["backward_s"] == pytest.approx(4 * MS * 3 / 4)  # the rank's 4 ms ÷ κ_c
    assert one["optimizer_s"] == pytest.approx(0.4 * MS)  # ÷ κ: the baseline's, as before
    # at the run's own world size, and beyond, κ_c cancels: the rank's measured forward
    assert predict_ddp(run, 2, Scenario(fixed_fraction=f, contention=k, compute_contention=k_c))["forward_s"] \
        == pytest.approx(4 * MS)


def test_compute_contention_is_kappa_wherever_f_fits():
    """The by-hand line above (rank 2.5 ms at 32, κ = 1.25 -> 2 ms alone; baseline 3 ms at 64): f = 0.5 passes
    through both forwards, so κ_c adds nothing; without a baseline, or for DP, κ_c is κ."""
    run = measure_run(_ddp_events())
    run.forward_s = 2.5 * MS
    f = fixed_fraction(_single(), run, 1.25)[0]
    assert compute_contention(_single(), run, 1.25, f) == (1.25, "as κ (the forwards fit f inside 0–100%)")
    assert compute_contention(None, run, 1.25, f)[0] == 1.25
    dp = measure_run(_dp_events())
    assert compute_contention(_single(), dp, 1.0, 0.0)[0] == 1.0
    with pytest.raises(ValueError, match="compute_contention"):
        predict({"ddp": run}, [1], Scenario(compute_contention=0.5))
