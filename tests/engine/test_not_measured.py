"""Never a number that was not measured (issue 31.3): an attached run's step on CUDA (DDP, DP or FSDP)
says `comm_exposed_measured: false`, and its exposed comm must then be null — not 0.0, which every
reader turned into "overlap 100%" — and the run's summary must carry no overlap figure and say why.
The CUDA side is a stand-in: the step fields an attached rank builds on CUDA, fed to the summary."""

from __future__ import annotations

from ddpviz.engine.measure.telemetry import step_fields
from ddpviz.engine.summary import (COMM_NOT_MEASURED, OVERLAP_NOT_MEASURED, OVERLAP_NOT_MEASURED_SHORT,
                                   SummaryBuilder)


def _step(step: int, measured: bool, exposed: float, **extra) -> dict:
    f = step_fields(loss=1.0, samples=8, step_time_s=0.010, forward_s=0.003, backward_s=0.004,
                    comm_exposed_s=exposed, optimizer_s=0.001, start=100.0 + step,
                    comm_exposed_measured=measured, backward_start_ts=100.0 + step, **extra)
    return dict(type="step", rank=0, step=step, **f)


def test_an_unmeasured_exposed_comm_is_null_not_zero():
    assert _step(0, measured=False, exposed=0.0)["comm_exposed_s"] is None
    assert _step(0, measured=True, exposed=0.0)["comm_exposed_s"] == 0.0  # measured 0 stays 0


def test_a_cuda_attached_runs_summary_has_no_overlap_and_says_not_measured():
    b = SummaryBuilder()
    for s in range(8):
        b.observe(_step(s, measured=False, exposed=0.0))
        for i in range(2):  # its buckets, with spans (CUDA events read later)
            b.observe(dict(type="bucket", rank=0, step=s, bucket_index=i, nbytes=4096, ready_s=0.001,
                           comm_start_s=0.001, comm_end_s=0.002 + i * 0.001))
    out = b.summary()
    assert out["overlap"] is None and out["comm_exposed_s"] is None
    assert out["comm_exposed_note"] == COMM_NOT_MEASURED


def test_buckets_without_an_end_give_no_overlap_figure():
    b = SummaryBuilder()
    for s in range(8):
        b.observe(_step(s, measured=True, exposed=0.002))
        b.observe(dict(type="bucket", rank=0, step=s, bucket_index=0, nbytes=4096, ready_s=None,
                       comm_start_s=0.001, comm_end_s=None))
    out = b.summary()
    assert out["overlap"] is None  # not 0% (all exposed) as a DP-like step would read
    assert out["overlap_note"] == OVERLAP_NOT_MEASURED  # and says why (bucket_timing=recorder)


def test_a_few_timed_steps_among_untimed_ones_give_no_overlap_figure():
    """Early in a recorder run the steady steps still hold the profiled steps 0-2 (timed, all exposed:
    0%) beside ordinary ones (untimed): the summary said "0%" then "not measured" once the profiled
    steps were left out. It says "not measured" throughout."""
    b = SummaryBuilder()
    for s in range(8):
        b.observe(_step(s, measured=True, exposed=0.002))
        timed = s < 3
        b.observe(dict(type="bucket", rank=0, step=s, bucket_index=0, nbytes=4096, ready_s=0.001,
                       comm_start_s=0.001 if timed else None, comm_end_s=0.003 if timed else None))
    out = b.summary()
    assert out["overlap"] is None and out["overlap_note"] == OVERLAP_NOT_MEASURED


def test_the_note_and_the_verdict_name_why_and_a_measured_overlap_has_none():
    from ddpviz.engine.verdict import Verdict

    b = SummaryBuilder()
    for s in range(8):  # every step spanned: 1 ms of a 2 ms all-reduce exposed, 50%
        b.observe(_step(s, measured=True, exposed=0.001))
        b.observe(dict(type="bucket", rank=0, step=s, bucket_index=0, nbytes=4096, ready_s=0.0,
                       comm_start_s=0.001, comm_end_s=0.003))
    out = b.summary()
    assert out["overlap"] == 0.5 and "overlap_note" not in out
    v = Verdict(leader="ddp", ratio=1.2, interval=(1.1, 1.3), dp_samples_per_s=1.0, ddp_samples_per_s=1.2,
                steps={"dp": 8, "ddp": 8}, dp_step_ms=12.0, ddp_step_ms=10.0, gap_ms=2.0,
                overlap_note=OVERLAP_NOT_MEASURED)
    # in short (the verdict is read first, everywhere), and why an exposed comm is shown beside an
    # overlap that is not (the tour, issue 33); the summary's note keeps the whole reason
    assert f"DDP's overlap is {OVERLAP_NOT_MEASURED_SHORT}." in v.why() and OVERLAP_NOT_MEASURED not in v.why()
    assert "its exposed part is, every step" in v.why() and "only on the profiled steps" in v.why()


def test_the_summary_gives_the_steps_own_reason_where_they_have_one():
    """A gloo run with bucket_timing=recorder is not CUDA: its steps' note, not "not measured on CUDA"."""
    b = SummaryBuilder()
    for s in range(8):
        b.observe(_step(s, measured=False, exposed=0.0, comm_exposed_note="bucket times on sampled steps only"))
    assert b.summary()["comm_exposed_note"] == "bucket times on sampled steps only"


def test_compare_carries_the_note_to_its_report():
    """`ddpviz compare --json`: the DDP entry's `overlap_note` is the summary's, for the verdict to say."""
    from ddpviz.engine.harness.compare import mode_report
    from ddpviz.engine.result import RunResult

    report = mode_report(RunResult("succeeded", summary={"overlap": None, "overlap_note": OVERLAP_NOT_MEASURED}), None)
    assert report["overlap"] is None and report["overlap_note"] == OVERLAP_NOT_MEASURED


def test_auto_is_the_recorder_on_gloo_and_the_hook_on_nccl():
    """The default `bucket_timing="auto"`: no Python per bucket on gloo; on NCCL the hook, until the
    no-hook path's cost there is measured on a GPU. What the rank runs is `no_hook_path`'s answer (a
    stand-in model: it builds nothing on NCCL here)."""
    import torch

    from ddpviz.engine.config import RunConfig, effective_bucket_timing
    from ddpviz.engine.modes.ddp.flight import no_hook_path

    auto = RunConfig()
    assert auto.bucket_timing == "auto"
    assert effective_bucket_timing(auto, "gloo") == "recorder" and effective_bucket_timing(auto, "nccl") == "hook"
    for chosen in ("hook", "recorder"):
        assert {effective_bucket_timing(RunConfig(bucket_timing=chosen), b) for b in ("gloo", "nccl")} == {chosen}
    model = torch.nn.Linear(4, 2)
    assert no_hook_path(auto, "gloo", model) is True
    assert no_hook_path(auto, "nccl", model) is False
    sparse = torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=True), torch.nn.Linear(4, 2))
    assert no_hook_path(auto, "gloo", sparse) is False  # the hook sees what a sparse bucket sends
    # find_unused_parameters: no rebuilt layout to read ready times by, an extra all-reduce on sampled steps
    unused = RunConfig(find_unused_parameters=True)
    assert effective_bucket_timing(unused, "gloo") == "hook" and no_hook_path(unused, "gloo", model) is False
    assert effective_bucket_timing(unused.model_copy(update=dict(bucket_timing="recorder")), "gloo") == "recorder"
