"""PyTorch's flight recorder as ddpviz reads it (issue 31; the attached NCCL path's sampled steps,
`engine.modes.ddp.flight.FlightReader` / `FlightBuckets`): which dump holds which backend's entries, the
host enqueue and GPU duration of each bucket kept apart (never a span), the buffer's size.

Independent references: hand-made recorder dumps (the NCCL case, with `duration_ms`, which this CPU
machine cannot produce) and the gloo recorder's own entries (`engine.harness.flight_cost`).
"""

from __future__ import annotations

import pickle

import pytest

from ddpviz.engine.modes.ddp.flight import FlightBuckets, FlightReader, buffer_entries, enable_recorder, recorder_on


def _dump(entries):
    return lambda **kw: pickle.dumps({"version": "2.x", "entries": entries})


def _entry(rid, created_ns, numel, duration_ms=None, name="nccl:all_reduce"):
    e = dict(record_id=rid, profiling_name=name, time_created_ns=created_ns, input_sizes=[[numel]],
             input_dtypes=["Float"])
    if duration_ms is not None:
        e["duration_ms"] = duration_ms
    return e


def test_nccl_entries_give_enqueue_times_and_gpu_durations_but_no_span(monkeypatch):
    """A stand-in NCCL dump: `time_created_ns` -> enqueue_s, `duration_ms` -> comm_duration_s, and no
    span made of the two (the GPU starts later than the host enqueues); entries created before the
    backward (a broadcast, the last step's buckets) and other collectives are not buckets."""
    monkeypatch.setattr("time.time_ns", lambda: 1_000_000_000)
    fb = FlightBuckets(FlightReader(lambda **kw: b""), lambda: [((3, 2), 400), ((1, 0), 800)], ["a", "b", "c", "d"])
    fb.begin_backward()
    fb.reader.dump = _dump([_entry(1, 999_000_000, 100, 0.5), _entry(2, 1_002_000_000, 100, 0.25),
                            _entry(3, 1_003_000_000, 7, name="nccl:all_gather"), _entry(4, 1_004_000_000, 200, 1.0)])
    out = fb.resolved()
    assert [b["nbytes"] for b in out] == [400, 800]
    assert [b["enqueue_s"] for b in out] == pytest.approx([0.002, 0.004])
    assert [b["comm_duration_s"] for b in out] == pytest.approx([0.00025, 0.001])
    assert all(b[k] is None for b in out for k in ("ready_s", "comm_start_s", "comm_end_s"))
    assert [b["param_names"] for b in out] == [["d", "c"], ["b", "a"]] and out[1]["is_last"]
    assert "GPU duration" in out[0]["source"] and "start and end not measured" in out[0]["source"]


def test_a_layout_that_does_not_match_the_entries_gives_no_parameter_counts():
    fb = FlightBuckets(FlightReader(_dump([_entry(1, 10**19, 100)])), lambda: [((0,), 999)], ["a"])
    fb.begin_backward()
    fb.origin_ns = 0
    (b,) = fb.resolved()
    assert b["nbytes"] == 400 and b["num_params"] is None and "param_names" not in b


def test_enable_recorder_sizes_the_buffer_and_keeps_a_users_choice():
    env: dict[str, str] = {}
    assert enable_recorder(buffer_entries(10), "nccl", env) == 36
    assert env["TORCH_FR_BUFFER_SIZE"] == "36" and env["TORCH_NCCL_ENABLE_TIMING"] == "1"
    mine = {"TORCH_FR_BUFFER_SIZE": "2000"}
    assert enable_recorder(36, "gloo", mine) == 2000 and "TORCH_NCCL_ENABLE_TIMING" not in mine
    # the one name each torch reads: the deprecated alias on 2.9+ makes every rank print a warning
    for version, names in (("2.13.0+cpu", {"TORCH_FR_BUFFER_SIZE"}), ("2.9.1", {"TORCH_FR_BUFFER_SIZE"}),
                           ("2.8.0+cu128", {"TORCH_NCCL_TRACE_BUFFER_SIZE"}),
                           ("nightly", {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"})):
        env = {}
        enable_recorder(36, "gloo", env, torch_version=version)
        assert set(env) == names, version


def test_an_attached_gloo_script_prints_no_warning_of_ddpvizs_recorder_variables(tmp_path):
    """Reference: the same process group made with no ddpviz variable prints nothing; with the variables
    `ddpviz run --bucket-timing recorder` sets, still nothing (the deprecated alias warned on every rank)."""
    import subprocess
    import sys

    from ddpviz.engine.attach.env import set_bucket_timing

    code = ("import torch.distributed as dist; dist.init_process_group('gloo', init_method='file://%s', rank=0, "
            "world_size=1); dist.all_reduce(__import__('torch').ones(1)); dist.destroy_process_group()")
    env: dict[str, str] = {}
    set_bucket_timing(env, "recorder")
    for extra in ({}, env):
        store = tmp_path / f"pg{len(extra)}"
        proc = subprocess.run([sys.executable, "-c", code % store], capture_output=True, text=True, timeout=120,
                              env={**__import__("os").environ, **extra})
        assert proc.returncode == 0 and "deprecated" not in proc.stderr, (extra, proc.stderr[-1000:])


def test_the_recorder_is_on_only_with_a_buffer():
    assert recorder_on({"TORCH_FR_BUFFER_SIZE": "36"}) and recorder_on({"TORCH_NCCL_TRACE_BUFFER_SIZE": "8"})
    assert not recorder_on({}) and not recorder_on({"TORCH_FR_BUFFER_SIZE": "0"})


def test_nccl_reads_the_recorder_that_holds_nccls_collectives(monkeypatch):
    """NCCL's entries are in a flight recorder of their own (`_dump_nccl_trace`); `_dump_fr_trace` dumps the
    generic one, which holds gloo's: on the H100 (torch 2.11) the latter returned no entry after 1,024 NCCL
    all-reduces. Stand-ins for both dumps, each saying which it is."""
    import torch._C._distributed_c10d as c10d

    from ddpviz.engine.modes.ddp.flight import dump_function

    def nccl(**kw):
        return pickle.dumps({"entries": [dict(record_id=0, profiling_name="nccl:all_reduce", time_created_ns=5)]})

    def generic(**kw):
        return pickle.dumps({"entries": []})

    monkeypatch.setattr(c10d, "_dump_nccl_trace", nccl, raising=False)
    monkeypatch.setattr(c10d, "_dump_fr_trace", generic, raising=False)
    assert dump_function("nccl") is nccl and dump_function("gloo") is generic
    assert [e["profiling_name"] for e in FlightReader(backend="nccl").read()] == ["nccl:all_reduce"]
    assert FlightReader(backend="gloo").read() == []
    monkeypatch.delattr(c10d, "_dump_nccl_trace")  # a build without NCCL: the generic dump is all there is
    assert dump_function("nccl") is generic


def test_flight_cost_reads_back_every_entry_it_made_on_gloo():
    """`engine.harness.flight_cost` on this machine's backend: the recorder it reads must hold the all-reduces it
    issued (on the H100 the wrong dump gave 0 of 1,024), each read timed."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:  # its own process: the recorder's buffer is read when the process group is made
        got = pool.apply(_flight_cost_small)
    assert got["backend"] == "gloo"
    assert [(r["held"], r["entries"]) for r in got["rows"]] == [(4, 4), (12, 12)]
    assert all(r["dump_ms"] > 0 and r["us_per_entry"] > 0 for r in got["rows"])
    assert "time_created_ns" in got["entry_keys"] and got["duration_ms_present"] is False  # gloo: no GPU time


def _flight_cost_small():
    from ddpviz.engine.harness.flight_cost import flight_cost

    return flight_cost((4, 12))
