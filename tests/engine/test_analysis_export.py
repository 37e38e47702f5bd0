"""Bandwidths, the ring cost model, theory bytes and exports, on real runs and known inputs."""

import csv
import io
import json

import pytest

from ddpviz.engine.analysis import bucket_bandwidths, fit_ring_model, predict_ring_s, ring_factor, theory_bytes
from ddpviz.engine.config import RunConfig
from ddpviz.engine.events import ListSink
from ddpviz.engine.export import chrome_trace, export_path, steps_csv, to_jsonl
from ddpviz.engine.run import run_training


def test_busbw_is_algbw_times_the_ring_factor():
    (b,) = bucket_bandwidths([dict(nbytes=1_000_000, comm_start_s=0.1, comm_end_s=0.3)], world_size=4)
    assert b["algbw_bytes_per_s"] == pytest.approx(5e6)
    assert b["busbw_bytes_per_s"] == pytest.approx(5e6 * 1.5)
    assert ring_factor(2) == 1.0 and ring_factor(8) == pytest.approx(1.75)


def test_a_gpu_duration_without_a_span_still_gives_the_bandwidth():
    """The flight recorder's GPU duration on NCCL comes with no span (`comm_duration_s`): bandwidth uses it;
    a measured span wins over it; with neither, no bandwidth (never a 0 that was not measured)."""
    dur, span, none = bucket_bandwidths([
        dict(nbytes=2_000_000, comm_start_s=None, comm_end_s=None, comm_duration_s=0.004),
        dict(nbytes=2_000_000, comm_start_s=0.1, comm_end_s=0.3, comm_duration_s=0.004),
        dict(nbytes=2_000_000, comm_start_s=None, comm_end_s=None, comm_duration_s=None)], world_size=2)
    assert dur["comm_s"] == pytest.approx(0.004) and dur["algbw_bytes_per_s"] == pytest.approx(5e8)
    assert span["comm_s"] == pytest.approx(0.2) and span["algbw_bytes_per_s"] == pytest.approx(1e7)
    assert none["algbw_bytes_per_s"] is None and none["busbw_bytes_per_s"] is None


def test_ring_model_recovers_a_known_latency_and_bandwidth():
    alpha, beta, n = 20e-6, 10e9, 4  # 20 us per hop, 10 GB/s links
    buckets = [dict(nbytes=b, comm_start_s=0.0, comm_end_s=2 * (n - 1) * alpha + ring_factor(n) * b / beta)
               for b in (1e5, 1e6, 4e6, 25e6)]
    m = fit_ring_model(buckets, n)
    assert m["alpha_s"] == pytest.approx(alpha, rel=1e-6)
    assert m["beta_bytes_per_s"] == pytest.approx(beta, rel=1e-6)
    assert predict_ring_s(m, 2e6) == pytest.approx(2 * 3 * alpha + 1.5 * 2e6 / beta)
    assert fit_ring_model(buckets[:1], n) is None


def test_theory_bytes_follow_the_star_and_the_ring():
    assert theory_bytes("dp", 4, 100) == {0: 300, 1: 100, 2: 100, 3: 100}
    assert theory_bytes("ddp", 4, 100) == {i: 150 for i in range(4)}


@pytest.fixture(scope="module")
def dp_events():
    sink = ListSink()
    run_training(RunConfig(mode="dp", width=16, depth=2, global_batch_size=16, steps=3, eval_every=0), sink, "e")
    return sink.events


def test_exports_round_trip(dp_events):
    lines = to_jsonl(dp_events).splitlines()
    assert [json.loads(x)["type"] for x in lines] == [e["type"] for e in dp_events]
    rows = list(csv.DictReader(io.StringIO(steps_csv(dp_events))))
    assert [int(r["step"]) for r in rows] == [0, 1, 2]
    assert float(rows[0]["samples_per_s"]) > 0
    assert list(rows[0])[:len(OLD_STEP_COLUMNS)] == OLD_STEP_COLUMNS


OLD_STEP_COLUMNS = ["rank", "device", "step", "loss", "samples", "step_time_s", "forward_s", "backward_s",
                    "comm_exposed_s", "optimizer_s", "samples_per_s", "start_ts"]  # the CSV's columns before 2026-12-06


def test_steps_csv_marks_the_steps_that_carry_the_instruments_work():
    """Hand-made steps: a memory-traced DDP step whose exposed comm came from the reducer, an ordinary
    one, and a DP check step. The old columns come first, unchanged; the flags and the source follow,
    empty where a step lacks them; the trace's step span carries `optimizer_s`."""
    from ddpviz.engine.summary import INSTRUMENT_FLAGS

    src = "backward end minus the last gradient's ready time (DDP's reducer, Reducer::get_backward_stats)"
    base = {"type": "step", "rank": 0, "device": "cpu:0", "loss": 1.5, "samples": 16, "step_time_s": 0.02,
            "forward_s": 0.005, "backward_s": 0.01, "comm_exposed_s": 0.001, "optimizer_s": 0.004,
            "samples_per_s": 800.0, "start_ts": 100.0}
    events = [{"type": "run_started", "mode": "ddp"},
              {**base, "step": 0, "memory_traced": True, "comm_exposed_source": src},
              {**base, "step": 1, "start_ts": 100.02},
              {**base, "step": 2, "start_ts": 100.04, "replica_check": True, "memory_traced": False}]
    rows = list(csv.reader(io.StringIO(steps_csv(events))))
    assert rows[0] == OLD_STEP_COLUMNS + ["memory_traced", "replica_check", "comm_exposed_source"]
    assert set(INSTRUMENT_FLAGS) <= set(rows[0])  # every flag the summary leaves steps out by
    assert [r[:3] for r in rows[1:]] == [["0", "cpu:0", "0"], ["0", "cpu:0", "1"], ["0", "cpu:0", "2"]]
    assert rows[1][9] == "0.004" and rows[1][11] == "100.0"  # optimizer_s, start_ts: where they were
    assert [r[12:] for r in rows[1:]] == [["True", "", src], ["", "", ""], ["False", "True", ""]]
    spans = [e for e in chrome_trace(events)["traceEvents"] if e["ph"] == "X" and e["cat"] == "step"]
    assert [e["args"] for e in spans][0] == {"loss": 1.5, "forward_s": 0.005, "backward_s": 0.01,
                                             "comm_exposed_s": 0.001, "optimizer_s": 0.004}


def test_chrome_trace_has_one_track_per_device_with_every_dp_phase(dp_events):
    trace = chrome_trace(dp_events)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {"device cpu:0", "device cpu:1"}
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["name"] for e in spans} >= {"broadcast", "scatter", "forward", "gather", "backward", "reduce"}
    assert all(e["dur"] >= 0 and e["ts"] > 1e15 for e in spans)  # microseconds since the epoch
    json.dumps(trace)


@pytest.mark.parametrize("bad", ["../etc/passwd", "a/b", "", "x" * 65, "..", "run id", "/abs"])
def test_export_paths_never_leave_their_folder(tmp_path, bad):
    with pytest.raises(ValueError, match="run_id"):
        export_path(tmp_path, bad, ".jsonl")


def test_export_path_for_a_normal_id(tmp_path):
    assert export_path(tmp_path, "abc-123_x", ".csv") == (tmp_path / "abc-123_x.csv").resolve()


@pytest.mark.slow
def test_ddp_trace_and_fit_on_a_real_run():
    sink = ListSink()
    run_training(RunConfig(mode="ddp", width=64, depth=3, global_batch_size=16, steps=5, eval_every=0,
                           bucket_cap_mb=0.005), sink, "d")
    buckets = [e for e in sink.of_type("bucket") if e["step"] >= 1]
    for b in bucket_bandwidths(buckets, 2):
        assert b["busbw_bytes_per_s"] == pytest.approx(b["algbw_bytes_per_s"])  # n = 2: factor 1
    trace = chrome_trace(sink.events)
    tracks = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert tracks == {"rank 0 (cpu:0)", "rank 1 (cpu:1)"}
    # one span per bucket whose all-reduce was timed: with bucket_timing=recorder (the default) the
    # profiled steps (0-2 and the last), none for step 3's, whose all-reduce end was not measured
    spanned = [b for b in sink.of_type("bucket") if b["comm_start_s"] is not None and b["comm_end_s"] is not None]
    assert {b["step"] for b in spanned} == {0, 1, 2, 4}
    assert sum(1 for e in trace["traceEvents"] if e.get("cat") == "bucket") == len(spanned)


# -- Chrome trace: complete events on one (pid, tid) nest or are disjoint (issue 12, case 8) ---------

def partial_overlaps(trace: dict) -> list[tuple[dict, dict]]:
    """Pairs of complete events on one (pid, tid) that overlap without one containing the other
    (what Perfetto drops)."""
    by_track: dict[tuple, list[dict]] = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            by_track.setdefault((e["pid"], e["tid"]), []).append(e)
    bad = []
    for spans in by_track.values():
        spans.sort(key=lambda e: (e["ts"], -e["dur"]))
        for i, a in enumerate(spans):
            a_end = a["ts"] + a["dur"]
            for b in spans[i + 1:]:
                if b["ts"] >= a_end:
                    break
                if b["ts"] + b["dur"] > a_end:  # starts inside a, ends after it
                    bad.append((a, b))
    return bad


def test_overlapping_bucket_all_reduces_get_tracks_of_their_own():
    """Two buckets in flight at once: [0, 3) and [2, 5) ms after backward starts, inside one step."""
    events = [{"type": "run_started", "mode": "ddp"},
              {"type": "step", "rank": 0, "device": "cpu:0", "step": 0, "start_ts": 100.0,
               "step_time_s": 0.010, "backward_start_ts": 100.001},
              *({"type": "bucket", "rank": 0, "device": "cpu:0", "step": 0, "bucket_index": b, "nbytes": 4,
                 "ready_s": s, "comm_start_s": s, "comm_end_s": e} for b, s, e in ((0, 0.0, 0.003),
                                                                                   (1, 0.002, 0.005)))]
    trace = chrome_trace(events)
    assert partial_overlaps(trace) == []
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 3 and len({(e["pid"], e["tid"]) for e in spans}) == 3
    assert len({e["pid"] for e in spans}) == 1  # one process: rank 0


def test_two_ddps_bucket_0_get_spans_of_their_own_names():
    """An attached GAN: G's and D's bucket 0 in one step (`ddp_index` 0 and 1)."""
    events = [{"type": "run_started", "mode": "ddp"},
              {"type": "step", "rank": 0, "device": "cpu:0", "step": 0, "start_ts": 100.0,
               "step_time_s": 0.010, "backward_start_ts": 100.001},
              *({"type": "bucket", "rank": 0, "device": "cpu:0", "step": 0, "ddp_index": d, "bucket_index": 0,
                 "nbytes": 4, "ready_s": s, "comm_start_s": s, "comm_end_s": s + 0.001} for d, s in ((1, 0.0), (0, 0.002)))]
    names = sorted(e["name"] for e in chrome_trace(events)["traceEvents"] if e["ph"] == "X" and e["cat"] == "bucket")
    assert names == ["all-reduce DDP 1 bucket 0", "all-reduce bucket 0"]


@pytest.mark.slow
def test_the_field_case_trace_has_no_partially_overlapping_events():
    sink = ListSink()
    run_training(RunConfig(mode="ddp", width=256, depth=4, bucket_cap_mb=0.25, steps=3, eval_every=0,
                           step_delay_s=0), sink, "t")
    trace = chrome_trace(sink.events)
    # every step of a 3-step run is profiled, so every bucket's all-reduce is timed and exported
    spanned = [b for b in sink.of_type("bucket") if b["comm_start_s"] is not None and b["comm_end_s"] is not None]
    assert len(spanned) == len(sink.of_type("bucket")) and {b["step"] for b in spanned} == {0, 1, 2}
    assert sum(1 for e in trace["traceEvents"] if e.get("cat") == "bucket") == len(spanned)
    assert partial_overlaps(trace) == []
