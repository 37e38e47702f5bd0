"""ddpviz.engine.verdict against hand-worked summaries: who leads, the gap's parts, and their sum."""

from __future__ import annotations

import pytest

from ddpviz.engine.verdict import LEVEL_WITHIN, verdict

# DP: step 10 ms; device 0 scatter 0.5 + gather 0.3 + loss 0.2 + reduce 1.0 ms, broadcast 0.8 ms;
# device threads waited for the GIL 1.5 ms (cpu:0) and 0.5 ms (cpu:1): mean 1.0 ms.
DP = {"samples_per_s": 6400.0, "step_time_s": 0.010, "comm_exposed_s": 0.0026,
      "dp_phase_s": {"broadcast": 0.0008, "scatter": 0.0005, "gather": 0.0003, "loss": 0.0002,
                     "reduce": 0.0010, "forward": 0.003, "backward": 0.004, "optimizer": 0.001},
      "gil_wait_s": {"cpu:0": 0.0015, "cpu:1": 0.0005}, "gil_wait_share": {"cpu:0": 0.15, "cpu:1": 0.05}}
# DDP: step 8 ms, 0.4 ms of all-reduce exposed, ranks waited 0.1 ms each for a lock.
DDP = {"samples_per_s": 8000.0, "step_time_s": 0.008, "comm_exposed_s": 0.0004, "overlap": 0.75,
       "gil_wait_s": {"cpu:0": 0.0001, "cpu:1": 0.0001}, "gil_wait_share": {"cpu:0": 0.0125, "cpu:1": 0.0125}}


def test_ddp_ahead_with_the_gap_split_by_hand():
    v = verdict(DP, DDP)
    assert v.leader == "ddp" and v.ratio == pytest.approx(1.25)
    assert v.gap_ms == pytest.approx(2.0)
    # by hand: device0 = 0.5+0.3+0.2+1.0 = 2.0; rebuild 0.8; gil = 1.0 - 0.1 = 0.9; allreduce -0.4
    assert v.parts_ms["device0"] == pytest.approx(2.0)
    assert v.parts_ms["rebuild"] == pytest.approx(0.8)
    assert v.parts_ms["gil"] == pytest.approx(0.9)
    assert v.parts_ms["allreduce"] == pytest.approx(-0.4)
    assert v.parts_ms["rest"] == pytest.approx(2.0 - 2.0 - 0.8 - 0.9 + 0.4)
    assert sum(v.parts_ms.values()) == pytest.approx(v.gap_ms)
    assert v.gil_share == {"dp": 0.15, "ddp": 0.0125}
    text = v.text()
    assert text.startswith("DDP is ahead: 1.25×")
    assert "GIL 15% of the step, DDP's ranks 1%" in text and "overlapped 75%" in text


def test_dp_ahead_says_the_copies_are_at_ram_speed_here():
    v = verdict({**DP, "samples_per_s": 9000.0, "step_time_s": 0.007}, DDP)
    assert v.leader == "dp" and v.headline().startswith("DP is ahead here: 1.12×")
    assert "DDP's step is 1.00 ms longer" in v.why() and "RAM speed" in v.why()


def test_within_two_percent_is_level_either_way():
    for dp_rate in (8000.0 / (LEVEL_WITHIN - 0.001), 8000.0 * (LEVEL_WITHIN - 0.001)):
        assert verdict({**DP, "samples_per_s": dp_rate}, DDP).leader == "level"
    assert verdict({**DP, "samples_per_s": 8000.0 / (LEVEL_WITHIN + 0.01)}, DDP).leader == "ddp"


def test_no_verdict_without_both_figures():
    assert verdict(DP, {**DDP, "samples_per_s": None}) is None
    assert verdict(None, DDP) is None
    assert verdict({**DP, "step_time_s": float("nan")}, DDP) is None


def test_unmeasured_parts_are_absent_not_zero():
    v = verdict({"samples_per_s": 100.0, "step_time_s": 0.02}, {"samples_per_s": 150.0, "step_time_s": 0.013})
    assert set(v.parts_ms) == {"rest"} and v.parts_ms["rest"] == pytest.approx(7.0)
    assert "GIL" not in v.why()


def test_the_compare_report_gives_the_same_verdict_as_the_summaries():
    from ddpviz.engine.harness.compare import report_verdict

    def entry(s):  # mode_report's shape: the split in a dict of its own
        split = {k: s.get(k) for k in ("step_time_s", "comm_exposed_s")}
        return {**{k: v for k, v in s.items() if k not in split}, "step_time_split": split}

    v = report_verdict({"dp": entry(DP), "ddp": entry(DDP)})
    assert v == verdict(DP, DDP)
    assert report_verdict({"dp": entry(DP)}) is None
