"""ddpviz.engine.verdict against hand-worked summaries: who leads (the interval rule), the gap's
parts (each measured once), what is not measured, and `ddpviz compare --json`'s `verdict`."""

from __future__ import annotations

import json

import pytest

from ddpviz.engine.summary import SummaryBuilder
from ddpviz.engine.verdict import MIN_STEADY_STEPS, verdict

# DP, means over steady steps (ms): step 11.0 = forward 3.0 + backward 4.0 (the loss on device 0
# included) + copies 2.6 (broadcast 0.8, scatter 0.5, gather 0.3, reduce 1.0) + optimizer 1.0
# + untimed 0.4. Its device threads waited for the GIL 1.5 ms (cpu:0) and 0.5 ms (cpu:1).
DP_MEAN = {"step_time_s": 0.011, "forward_s": 0.003, "backward_s": 0.004, "comm_exposed_s": 0.0026,
           "optimizer_s": 0.001, "untimed_s": 0.0004}
DP_PHASES = {"broadcast": 0.0008, "scatter": 0.0005, "gather": 0.0003, "reduce": 0.0010, "loss": 0.0002,
             "forward": 0.003, "backward": 0.0038, "optimizer": 0.001}
# DDP (ms): step 8.0 = forward 2.5 + backward 3.5 + exposed all-reduce 0.4 + optimizer 1.0 + untimed 0.6.
DDP_MEAN = {"step_time_s": 0.008, "forward_s": 0.0025, "backward_s": 0.0035, "comm_exposed_s": 0.0004,
            "optimizer_s": 0.001, "untimed_s": 0.0006}


def summaries(dp_sps, ddp_sps, ddp_mean=DDP_MEAN):
    dp = {"steady_samples_per_s": dp_sps, "steady_mean_s": DP_MEAN, "dp_phase_mean_s": DP_PHASES,
          "gil_wait_s": {"cpu:0": 0.0015, "cpu:1": 0.0005}, "gil_wait_share": {"cpu:0": 0.15, "cpu:1": 0.05}}
    ddp = {"steady_samples_per_s": ddp_sps, "steady_mean_s": ddp_mean, "overlap": 0.75,
           "gil_wait_s": {"cpu:0": 0.0001, "cpu:1": 0.0001}, "gil_wait_share": {"cpu:0": 0.0125, "cpu:1": 0.0125}}
    return dp, ddp


def test_a_clear_ddp_win_and_the_gap_split_by_hand():
    # every resample's median lies in [100, 110] for DP and [150, 160] for DDP, so the whole
    # interval lies in [150/110, 160/100] = [1.364, 1.6]; the medians: 155 / 105
    v = verdict(*summaries([100.0, 110.0] * 10, [150.0, 160.0] * 10))
    assert v.leader == "ddp" and v.ratio == pytest.approx(155 / 105)
    assert 150 / 110 <= v.interval[0] <= v.ratio <= v.interval[1] <= 160 / 100
    assert v.steps == {"dp": 20, "ddp": 20}
    # by hand: gap 11.0 - 8.0 = 3.0 ms; compute (3+4) - (2.5+3.5) = 1.0; rebuild 0.8; device 0
    # 0.5+0.3+1.0 = 1.8; optimizer 0; all-reduce -0.4; not measured 0.4 - 0.6 = -0.2
    assert v.gap_ms == pytest.approx(3.0)
    assert v.parts_ms == pytest.approx({"compute": 1.0, "rebuild": 0.8, "device0": 1.8, "optimizer": 0.0,
                                        "allreduce": -0.4})
    assert v.not_measured_ms == pytest.approx(-0.2)
    assert "gil" not in v.parts_ms and v.gil_wait_ms == pytest.approx({"dp": 1.0, "ddp": 0.1})
    text = v.text()
    assert text.startswith("DDP is ahead: 1.48× DP's samples/s, 90% interval")
    assert "not measured: -0.20 ms" in text and "rest" not in text
    assert "Inside those parts, not added to them: DP's device threads waited for the GIL 1.00 ms" in text
    assert "DP's mean step is 3.00 ms longer: " in text  # mean and median agree: no caveat


def test_a_mean_that_disagrees_with_the_medians_says_so():
    # the medians put DP ahead (155 vs 105 samples/s) while DP's mean step (11.0 ms) is the longer
    # one (DDP 8.0): the parts explain the means, so the sentence must say the two measures differ
    v = verdict(*summaries([150.0, 160.0] * 10, [100.0, 110.0] * 10))
    assert v.leader == "dp" and v.gap_ms == pytest.approx(3.0)
    assert v.why().startswith("By the medians the verdict compares, DP is ahead; the means, which also count a "
                              "few slow steps, make DP's step 3.00 ms longer: ")
    # with step times (DP 6 ms for 15 steps, 30 ms for 5: mean 12, median 6; DDP 8 ms): the medians' gap is
    # said once, in that same clause, not again beside the interval
    dp, ddp = summaries([150.0, 160.0] * 10, [100.0, 110.0] * 10)
    dp["steady_step_time_s"], ddp["steady_step_time_s"] = [0.006] * 15 + [0.030] * 5, [0.008] * 20
    why = verdict(dp, ddp).why()
    assert why.startswith("By the medians the verdict compares, DDP's median step is 2.00 ms longer; the means, "
                          "which also count a few slow steps, make DP's step 3.00 ms longer (90% interval ")
    assert why.count("median step") == 1 and "the parts add up to the means" not in why


def test_a_clear_dp_win():
    v = verdict(*summaries([150.0, 160.0] * 10, [100.0, 110.0] * 10))
    assert v.leader == "dp" and v.interval[1] <= 110 / 150 < 1
    assert v.headline().startswith("DP is ahead here: 1.48× DDP's samples/s, 90% interval")


def test_a_level_pair_says_level_within_noise_and_what_would_separate_them():
    v = verdict(*summaries([100.0] * 12, [100.0] * 12))
    assert v.leader == "level" and v.ratio == 1.0 and v.interval == (1.0, 1.0)
    assert "level on this machine, within noise" in v.headline()
    assert "What would separate them: more steps" in v.headline()
    assert "measured in turns (`ddpviz compare --modes dp,ddp`)" in v.why()  # the page says what this machine did
    # the headline named a quieter machine already: the figures follow without saying it again
    assert "whether the cores are free" not in v.why() and "For scale, the default pair (batch 256)" in v.why()
    assert "whether the cores are free" in verdict(*summaries([150.0] * 8, [100.0] * 8)).why()  # DP ahead: said


def test_only_a_ddp_win_goes_without_the_note_on_what_the_cpu_did():
    assert "measured in turns" not in verdict(*summaries([100.0] * 8, [150.0] * 8)).why()
    assert "measured in turns" in verdict(*summaries([150.0] * 8, [100.0] * 8)).why()


def test_an_interval_that_straddles_1_is_level_by_hand():
    # DP: 90 for five steps then 110 for five; block_for(10) = 2, so the blocks are
    # [90,90] [90,90] [90,110] [110,110] [110,110], and a resample of 5 blocks has
    # n90 = 2a + c nineties (a: all-90 blocks drawn, c: mixed ones). Its median is 90 when
    # n90 >= 6: P = 0.410 (sum over the multinomial(5; 2/5, 1/5, 2/5)), 110 when n90 <= 4
    # (0.410 by symmetry), else 100. Both tails hold more than 5%, so the 90% interval of
    # DDP (always 103) / DP is exactly [103/110, 103/90] = [0.936, 1.144], which holds 1: level,
    # though the medians alone say DDP 1.03x
    v = verdict(*summaries([90.0] * 5 + [110.0] * 5, [103.0] * 10))
    assert v.interval == pytest.approx((103 / 110, 103 / 90))
    assert v.ratio == pytest.approx(1.03) and v.leader == "level"


def test_exposed_comm_not_measured_is_named_never_zero():
    no_comm = {**DDP_MEAN, "comm_exposed_s": None, "untimed_s": 0.0010}  # the 0.4 ms sit in untimed now
    v = verdict(*summaries([100.0] * 8, [130.0] * 8, no_comm))
    assert "allreduce" not in v.parts_ms
    assert v.not_measured_ms == pytest.approx(0.4 - 1.0)
    assert "exposed all-reduce, not measured on this run, is in it" in v.why()


def test_no_verdict_before_enough_steady_steps_or_without_figures():
    few = [100.0] * (MIN_STEADY_STEPS - 1)
    assert verdict(*summaries(few, [100.0] * 20)) is None
    assert verdict(None, summaries([1.0] * 9, [1.0] * 9)[1]) is None
    dp, ddp = summaries([100.0] * 9, [100.0] * 9)
    assert verdict({**dp, "steady_mean_s": None}, ddp) is None


def test_the_summary_gives_the_verdict_its_samples_and_means():
    # 12 steps of 10 ms (forward 2, backward 3, comm 1, optimizer 2: 2 ms untimed); steps 0-2
    # are warm-up, step 5 carries a memory trace: the steady steps are 3, 4, 6, 7, ..., 11
    b = SummaryBuilder()
    for k in range(12):
        t = 0.010 if k != 6 else 0.020  # step 6 is 10 ms longer, all of it untimed
        b.observe({"type": "step", "rank": 0, "step": k, "samples": 40, "step_time_s": t, "forward_s": 0.002,
                   "backward_s": 0.003, "comm_exposed_s": 0.001, "optimizer_s": 0.002, "memory_traced": k == 5})
    s = b.summary()
    assert s["steady_samples_per_s"] == [4000.0, 4000.0, 2000.0] + [4000.0] * 5
    assert s["steady_mean_s"]["step_time_s"] == pytest.approx((7 * 0.010 + 0.020) / 8)
    assert s["steady_mean_s"]["untimed_s"] == pytest.approx((7 * 0.002 + 0.012) / 8)


def test_compare_json_carries_the_verdict_end_to_end(tmp_path):
    """A tiny real DP/DDP pair through `ddpviz compare --json`: the top-level `verdict` has its
    fields, its ratio is the modes' own samples/s ratio, and its parts are the modes' own means."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "ddpviz.workers", "compare", "--modes", "dp,ddp", "--json",
                          "--steps", "16", "--width", "8", "--depth", "1", "--step-delay-s", "0", "--no-probe",
                          "--eval-every", "0"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    v = report["verdict"]
    assert v["winner"] in ("dp", "ddp", "level") and len(v["interval"]) == 2
    assert v["ratio"] == pytest.approx(report["ddp"]["samples_per_s"] / report["dp"]["samples_per_s"])
    assert v["interval"][0] <= v["ratio"] <= v["interval"][1]
    assert v["winner"] == ("ddp" if v["interval"][0] > 1 else "dp" if v["interval"][1] < 1 else "level")
    a, b = report["dp"]["steady_mean_s"], report["ddp"]["steady_mean_s"]
    assert v["parts_ms"]["compute"] == pytest.approx(
        (a["forward_s"] + a["backward_s"] - b["forward_s"] - b["backward_s"]) * 1e3)
    if b["comm_exposed_s"] is None:  # not measured (a recorder-path step): no part, never 0
        assert "allreduce" not in v["parts_ms"] and "not measured on this run" in v["not_measured_note"]
    else:
        assert v["parts_ms"]["allreduce"] == pytest.approx(-b["comm_exposed_s"] * 1e3)
    assert v["not_measured_ms"] == pytest.approx((a["untimed_s"] - b["untimed_s"]) * 1e3)
    assert v["steps"] == {"dp": len(report["dp"]["steady_samples_per_s"]),
                          "ddp": len(report["ddp"]["steady_samples_per_s"])}


def test_bootstrap_blocks_by_hand():
    from ddpviz.engine.measure.bootstrap import blocks_of
    from ddpviz.engine.verdict import block_for

    assert [block_for(n) for n in (6, 20, 49, 50, 300)] == [1, 4, 9, 10, 10]
    assert blocks_of([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    with pytest.raises(ValueError, match="block must be >= 1"):
        blocks_of([1.0], 0)


def test_the_gap_of_the_means_comes_with_its_interval_and_the_medians_where_they_differ():
    """With each run's steady step times: DP's 10 ms for 10 steps then 12 ms (mean 11, as DP_MEAN), DDP's 8 ms.
    Blocks of 4 steps (20 steps, at least 5 blocks): a resampled DP mean lies in [10, 12], so the gap's interval
    lies in [2, 4] ms and holds 3; the medians agree (11 - 8). Then DP's 9.5 ms for 15 steps and 15.5 for 5: the
    same mean, the median 9.5, so the medians' 1.5 ms is said beside the means' 3.0."""
    dp, ddp = summaries([100.0, 110.0] * 10, [150.0, 160.0] * 10)
    dp["steady_step_time_s"], ddp["steady_step_time_s"] = [0.010] * 10 + [0.012] * 10, [0.008] * 20
    v = verdict(dp, ddp)
    lo, hi = v.gap_interval_ms
    assert 2.0 <= lo < 3.0 < hi <= 4.0 and v.median_gap_ms == pytest.approx(3.0)
    assert f"DP's mean step is 3.00 ms longer (90% interval {lo:.2f}–{hi:.2f} ms): " in v.why()
    dp["steady_step_time_s"] = [0.0095] * 15 + [0.0155] * 5
    v = verdict(dp, ddp)
    assert v.median_gap_ms == pytest.approx(1.5)
    assert "; DP's median step is 1.50 ms longer: the parts add up to the means)" in v.why()
    # DDP's steps now 6-10 ms (mean 8): DP's 3 ms lead by the means, yet some resamples put DDP's mean near DP's
    ddp["steady_step_time_s"] = [0.006] * 10 + [0.010] * 10
    dp["steady_step_time_s"] = [0.006] * 10 + [0.016] * 10  # mean 11, median 11 (between 6 and 16)
    v = verdict(dp, ddp)
    lo, hi = v.gap_interval_ms
    # DDP leads by the medians beyond noise: the means' interval reaching 0 is not called "within noise"
    assert lo < 0 < hi and f"(90% interval {lo:.2f}–{hi:.2f} ms: it reaches 0; the means, with their" in v.why()
    assert "within noise" not in v.why()
    level = summaries([100.0] * 20, [100.0] * 20)  # level by the medians: then it is within noise
    for a, b in zip(level, (dp, ddp)):
        a["steady_step_time_s"] = b["steady_step_time_s"]
    assert verdict(*level).leader == "level" and ": it holds 0, within noise" in verdict(*level).why()
    # level by the medians, yet the means' interval (DP 10-12 ms against DDP's 8) lies above 0: said so
    level[0]["steady_step_time_s"], level[1]["steady_step_time_s"] = [0.010] * 10 + [0.012] * 10, [0.008] * 20
    assert ": the means differ beyond noise; the medians, which the verdict compares, do not)" in verdict(*level).why()
    # summaries written before they carried step times: no interval, nothing claimed
    del dp["steady_step_time_s"]
    assert verdict(dp, ddp).gap_interval_ms is None and "interval" not in verdict(dp, ddp).why()


def test_the_mean_difference_interval_by_hand():
    from ddpviz.engine.measure.bootstrap import mean_difference_interval

    assert mean_difference_interval([5.0] * 8, [2.0] * 6, 2, 3) == [3.0, 3.0]  # no spread: the difference itself
    lo, hi = mean_difference_interval([1.0] * 5 + [3.0] * 5, [0.0] * 10, 5, 5)
    assert lo == 1.0 and hi == 3.0  # two blocks, all 1s or all 3s: both drawn twice in some resample of 2000


def test_ddps_gil_figure_says_its_backward_was_not_metered_where_its_source_says_so():
    """A DDP rank with no ready mark in its thread (bucket_timing=recorder) meters forward and the optimizer only
    (engine.measure.gil_rank); the sentence must not present that figure as the whole step's."""
    from ddpviz.engine.measure.gil_rank import BACKWARD_LEFT_OUT

    dp, ddp = summaries([100.0, 110.0] * 10, [150.0, 160.0] * 10)
    assert "not metered" not in verdict(dp, ddp).why()
    ddp["gil_source"] = f"measured: schedstat; DDP rank: the training thread in forward and the optimizer; " \
                        f"{BACKWARD_LEFT_OUT}"
    assert ("DDP's ranks 0.10 ms in forward and the optimizer (their all-reducing backward is not metered) "
            "(measured: schedstat)") in verdict(dp, ddp).why()
