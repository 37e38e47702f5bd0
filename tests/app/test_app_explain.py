"""The pages' sentences and tables about DP vs DDP, from hand-worked figures."""

import pandas as pd

from app import explain
from app.frames import compare as fc


def _row(mode, sps, fwd, bwd, comm, opt, step):
    return {"run": mode.upper(), "mode": mode, "samples_per_s": sps, "step_time_ms": step,
            "forward_ms": fwd, "backward_ms": bwd, "comm_exposed_ms": comm, "optimizer_ms": opt}


def test_why_dp_is_ahead_names_ddps_largest_extra_parts_from_the_split():
    # DP 10 ms = 2 + 3 + 1.5 + 1 (+2.5 other); DDP 12.5 ms = 2.5 + 3 + 4 + 1 (+2 other)
    table = pd.DataFrame([_row("dp", 1000.0, 2.0, 3.0, 1.5, 1.0, 10.0),
                          _row("ddp", 800.0, 2.5, 3.0, 4.0, 1.0, 12.5)])
    text = explain.why_dp_ahead(table)
    assert "DP is ahead here (1.25× DDP's samples/s)" in text
    assert "DDP's step is 2.50 ms longer: +2.50 ms in all-reduce left exposed after backward " \
           "and +0.50 ms in forward." in text
    assert "DP's copies cost it 1.50 ms per step" in text


def test_a_lead_under_2_percent_is_called_level_not_ahead():
    table = pd.DataFrame([_row("dp", 1010.0, 2.0, 3.0, 1.5, 1.0, 10.0),
                          _row("ddp", 1000.0, 2.5, 3.0, 4.0, 1.0, 10.1)])
    text = explain.why_dp_ahead(table)
    assert text.startswith("DP and DDP are level here (DP at 1.010× DDP's samples/s, within 2%).")
    assert "ahead" not in text


def test_no_sentence_when_ddp_leads_or_there_is_no_pair():
    ahead = pd.DataFrame([_row("dp", 700.0, 2.0, 3.0, 1.5, 1.0, 10.0),
                          _row("ddp", 800.0, 2.5, 3.0, 4.0, 1.0, 12.5)])
    assert explain.why_dp_ahead(ahead) is None
    assert explain.why_dp_ahead(ahead[ahead["mode"] == "dp"]) is None


def test_buffers_frame_marks_ranks_that_start_from_rank_0s_buffers():
    sync = {"type": "sync", "step": 4, "checksums": [[1, 1], [1, 1]], "in_sync": True, "buffers": [
        {"name": "bn.running_mean", "rank": 0, "at_forward_start": [0.5, 0.1], "after_step": [0.7, 0.2]},
        {"name": "bn.running_mean", "rank": 1, "at_forward_start": [0.5, 0.1], "after_step": [0.6, 0.2]},
        {"name": "bn.running_var", "rank": 1, "at_forward_start": [9.0, 3.0], "after_step": [9.1, 3.0]},
        {"name": "bn.running_var", "rank": 0, "at_forward_start": [8.0, 3.0], "after_step": [8.1, 3.0]}]}
    view = fc.RunView(label="DDP", record={"config": {"mode": "ddp", "world_size": 2}},
                      events={"sync": [sync]})
    df = fc.buffers_frame([view]).set_index(["buffer", "rank"])
    assert df.loc[("bn.running_mean", 1), "as_rank0_at_forward"]
    assert not df.loc[("bn.running_var", 1), "as_rank0_at_forward"]
    assert df.loc[("bn.running_mean", 0), "after_step"] == 0.7
    single = fc.RunView(label="S", record={"config": {"mode": "single"}}, events={"sync": [sync]})
    assert fc.buffers_frame([single]).empty


def test_replica_verdicts_say_what_each_mode_checks():
    def view(mode, in_sync):
        return fc.RunView(label=mode, record={"config": {"mode": mode, "world_size": 2}},
                          events={"sync": [{"type": "sync", "step": 1, "in_sync": in_sync}]})
    assert fc.replica_verdict(view("single", None)) == "n/a (one device)"
    assert fc.replica_verdict(view("ddp", False)) == "NO"
    assert fc.replica_verdict(view("dp", True)) == "rebuilt each step; as computed with: yes"
    lost = fc.RunView(label="dp", record={"config": {"mode": "dp", "world_size": 2}}, events={"sync": [
        {"type": "sync", "step": 1, "in_sync": True, "buffers_discarded": 1}]})
    assert fc.replica_verdict(lost) == ("rebuilt each step; as computed with: yes; discards buffer updates "
                                        "made on replicas: 1 buffer(s)")
    assert fc.replicas_in_sync(view("single", None)) is None


def test_live_table_uses_the_same_medians_the_page_shows():
    """12 steps: the first 3 are warm-up and step 6 was traced (the instrument's own work), so
    the medians are over steps 3, 4, 5, 7..11 (the run summary's rule): samples/s 3..11 without
    6 -> median of [3, 4, 5, 7, 8, 9, 10, 11] = 7.5."""
    n = 12
    steps = pd.DataFrame({"run": ["a"] * n, "step": list(range(n)), "samples_per_s": [float(s) for s in range(n)],
                          "step_time_ms": [100.0 - s for s in range(n)], "forward_ms": [1.0] * n,
                          "backward_ms": [0.0] * n, "comm_exposed_ms": [0.0] * n, "optimizer_ms": [0.0] * n,
                          "instrument": [s == 6 for s in range(n)]})
    steps.loc[6, "samples_per_s"] = 1000.0  # would move the median if it were counted
    row = explain.table_from_steps(steps, {"a": "dp"}).iloc[0]
    assert (row["mode"], row["samples_per_s"], row["step_time_ms"]) == ("dp", 7.5, 92.5)
