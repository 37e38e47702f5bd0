"""`ddpviz run --bucket-timing recorder -- torchrun ...` (issue 31): no comm hook on the script's DDP.

Independent references: the same script run without ddpviz (final parameters bit for bit), DDP's
own `_get_ddp_logging_data()` and `_comm_hooks` (read by the script itself at its end), and the
rule that picks the sampled steps (`should_trace_memory` with the attach's `STEPS_HINT`).
"""

from __future__ import annotations

import pytest
from attach_tools import assert_params_bitwise_equal, by_rank, ints, params, reports, run_attached, run_plain, torchrun

from ddpviz.engine.attach.memory import STEPS_HINT
from ddpviz.engine.attach.nohook import SCRIPT_HOOK_SOURCE
from ddpviz.engine.measure.memory_sampler import should_trace_memory
from ddpviz.engine.modes.ddp.reducer import READY_EXPOSED_SOURCE, READY_SOURCE
from ddpviz.engine.modes.ddp.sampled import PROFILER_SOURCE
from ddpviz.workers.connection import connect
from ddpviz.workers.history import read_all_events

pytestmark = pytest.mark.slow
RECORDER = ("--bucket-timing", "recorder")


@pytest.fixture(scope="module")
def redis_client(redis_url):
    c = connect(redis_url)
    c.flushdb()
    yield c
    c.flushdb()


def _attached(tmp, cmd, redis_url, client):
    plain = run_plain(cmd, tmp / "plain.json")
    assert plain.returncode == 0, plain.stderr[-3000:]
    proc, run_id = run_attached(cmd, redis_url, tmp / "att.json", tmp / "spool", *RECORDER)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from ddpviz.workers.client import DdpvizClient

    events = read_all_events(DdpvizClient(redis=client), run_id)
    return dict(tmp=tmp, events=events, mine=reports(tmp / "att.json"), stderr=proc.stderr,
                record=DdpvizClient(redis=client).get_run(run_id))


@pytest.fixture(scope="module")
def regression(tmp_path_factory, redis_url, redis_client):
    """train_regression.py (8 steps a rank, 3 buckets after DDP's rebuild, no_sync accumulation)."""
    cmd = torchrun("train_regression.py", "--epochs", "1", "--accum", "2")
    return _attached(tmp_path_factory.mktemp("recorder"), cmd, redis_url, redis_client)


def test_training_is_bitwise_that_of_the_script_without_ddpviz(regression):
    assert_params_bitwise_equal(regression["tmp"])


def test_the_sampled_steps_profiler_adds_no_line_to_the_scripts_output(regression):
    """Kineto prints a 'USDT: ... profiler_start' and '... profiler_stop' line at each profile on this torch (the
    reference: one profile in a plain process); the attached script's output holds none of them."""
    import subprocess
    import sys

    plain = subprocess.run([sys.executable, "-c", "import torch\nfrom torch.profiler import profile\n"
                            "with profile():\n    torch.ones(2) + 1"], capture_output=True, text=True, timeout=120)
    if "profiler_start" not in plain.stderr:
        pytest.skip("this torch's Kineto prints nothing at a profile")
    assert any(e.get("source") == PROFILER_SOURCE for e in regression["events"] if e["type"] == "bucket")
    assert "profiler_start" not in regression["stderr"] and "profiler_stop" not in regression["stderr"]


def test_ddp_holds_no_comm_hook_so_no_python_runs_per_bucket(regression):
    for rank in (0, 1):  # DDP's own list of the Python hooks it calls per bucket (the hook path: 1)
        assert regression["mine"][rank]["comm_hooks"] == 0


def test_every_steps_buckets_are_ddps_own_layout(regression):
    buckets = by_rank(regression["events"], "bucket")
    for rank in (0, 1):
        log, names = regression["mine"][rank]["ddp_logging"], regression["mine"][rank]["param_names"]
        steps = regression["mine"][rank]["steps"]
        by_step: dict[int, list[dict]] = {}
        for e in buckets[rank]:
            by_step.setdefault(e["step"], []).append(e)
        assert sorted(by_step) == list(range(steps))
        for step, rows in by_step.items():
            rows.sort(key=lambda e: e["bucket_index"])
            # DDP rebuilds its buckets once, in the forward after the first synced backward
            want = ints(log["bucket_sizes"] if step == 0 else log["rebuilt_bucket_sizes"])
            assert [e["nbytes"] for e in rows] == want, (rank, step)
        expected = [[names[int(i)] for i in g.split()] for g in log["rebuilt_per_bucket_param_indices"].split(",")]
        assert [e["param_names"] for e in sorted(by_step[1], key=lambda e: e["bucket_index"])] == expected
    preview = regression["record"]["started"]["bucket_preview"]
    log0 = regression["mine"][0]["ddp_logging"]
    assert [b["nbytes"] for b in preview["initial"]] == ints(log0["bucket_sizes"])
    assert [b["nbytes"] for b in preview["rebuilt"]] == ints(log0["rebuilt_bucket_sizes"])


def test_bucket_times_on_sampled_steps_only(regression):
    buckets = by_rank(regression["events"], "bucket")
    for rank in (0, 1):
        sampled = {s for s in range(regression["mine"][rank]["steps"]) if should_trace_memory(s, STEPS_HINT)}
        assert sampled == {0, 1, 2}  # the script's 8 steps: both kinds are seen
        for e in buckets[rank]:
            if e["step"] in sampled:
                assert e["sampled"] is True and e["source"] == PROFILER_SOURCE, e
                assert 0 <= e["ready_s"] <= e["comm_start_s"] <= e["comm_end_s"], e
            else:  # DDP's reducer's own ready stamps; the all-reduce's times not measured
                assert e["sampled"] is False and e["source"] == READY_SOURCE, e
                assert e["ready_s"] > 0 and e["comm_start_s"] is None and e["comm_end_s"] is None, e


def test_comm_volume_and_exposed_comm_every_step(regression):
    events = regression["events"]
    for rank in (0, 1):
        log = regression["mine"][rank]["ddp_logging"]
        volume = {e["step"]: e for e in by_rank(events, "comm_volume")[rank]}
        steps = sorted(by_rank(events, "step")[rank], key=lambda e: e["step"])
        assert sorted(volume) == [e["step"] for e in steps] == list(range(regression["mine"][rank]["steps"]))
        for e in steps:
            want = sum(ints(log["bucket_sizes"] if e["step"] == 0 else log["rebuilt_bucket_sizes"]))
            assert volume[e["step"]]["allreduce_bytes"] == want
            assert e["comm_exposed_measured"] is True and 0 <= e["comm_exposed_s"] <= e["step_time_s"], e
            if not should_trace_memory(e["step"], STEPS_HINT):  # from DDP's reducer's ready stamps
                assert e["comm_exposed_source"] == READY_EXPOSED_SOURCE, e


def test_a_scripts_own_hook_goes_to_ddp_unwrapped_and_its_times_are_not_claimed(tmp_path, redis_url, redis_client):
    """train_fp16_hook.py registers PyTorch's fp16_compress_hook: DDP runs it as it would without
    ddpviz (parameters bit for bit), and no bucket claims a time, sampled steps included."""
    got = _attached(tmp_path, torchrun("train_fp16_hook.py", "--steps", "5"), redis_url, redis_client)
    for rank in (0, 1):
        a, b = params(tmp_path / "att.json", rank), params(tmp_path / "plain.json", rank)
        assert a.keys() == b.keys() and all(a[n].equal(b[n]) for n in a)
        rows = by_rank(got["events"], "bucket")[rank]
        assert sorted({e["step"] for e in rows}) == list(range(got["mine"][rank]["steps"]))
        last = max(e["step"] for e in rows)
        fp32 = ints(got["mine"][rank]["ddp_logging"]["rebuilt_bucket_sizes"])
        assert [e["nbytes"] for e in sorted((e for e in rows if e["step"] == last), key=lambda e: e["bucket_index"])] == fp32
        for e in rows:
            assert e["source"] == SCRIPT_HOOK_SOURCE and e["comm_hook"].endswith("fp16_compress_hook"), e
            assert e["ready_s"] is None and e["comm_start_s"] is None and e["comm_end_s"] is None and not e["sampled"]


def test_a_script_that_runs_pytorchs_profiler_keeps_it_whole_and_ddpviz_stands_aside(tmp_path, redis_url,
                                                                                      redis_client):
    """train_regression.py --profile: the script's own scheduled profiler (warm-up steps 0-1, record 2-3) over
    ddpviz's sampled steps 0-2. References: the script without ddpviz (its trace's event counts within 10%,
    parameters bit for bit; its trace holds at least the plain run's events: ddpviz's own work in the process is
    in it too, 650 more events in the first cycle here, 16 in the second); ddpviz's sampled steps keep DDP's
    ready stamps and say why no span."""
    from ddpviz.engine.modes.ddp.sampled import SCRIPT_PROFILER

    got = _attached(tmp_path, torchrun("train_regression.py", "--epochs", "1", "--profile"), redis_url, redis_client)
    assert_params_bitwise_equal(tmp_path)
    plain = reports(tmp_path / "plain.json")
    for rank in (0, 1):
        mine, theirs = got["mine"][rank]["profiled_events"], plain[rank]["profiled_events"]
        assert len(mine) == len(theirs) == 2 and all(a >= b for a, b in zip(mine, theirs)), (
            mine, theirs)  # without the guard: none, or a crash (SIGSEGV) at the first record
        for e in by_rank(got["events"], "bucket")[rank]:
            assert e["sampled"] is False and e["comm_start_s"] is None, e
            if should_trace_memory(e["step"], STEPS_HINT) and e["step"] > 0:  # step 0: no ready stamps yet
                assert e["source"].startswith(READY_SOURCE) and e["source"].endswith(SCRIPT_PROFILER), e
