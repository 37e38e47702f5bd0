"""`ddpviz run -- torchrun ...` on the unmodified scripts of examples/attach (issue 24).

Each attached run is checked against an independent reference: DDP's own
`_get_ddp_logging_data()` (bucket sizes and parameters, taken inside the script), the script's own
counters (steps, micro-steps, losses), and the same script run without ddpviz (same seed:
parameters bitwise equal).
"""

from __future__ import annotations

import pytest
import torch
from attach_tools import assert_params_bitwise_equal, by_rank, ints, params, reports, run_attached, run_plain, torchrun

from ddpviz.workers import keys
from ddpviz.workers.client import DdpvizClient
from ddpviz.workers.connection import connect
from ddpviz.workers.history import read_all_events

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(redis_url):
    c = connect(redis_url)
    c.flushdb()
    c.set(keys.APP_URL, "http://127.0.0.1:8599")  # as a `ddpviz up --port 8599` on this Redis records it
    yield DdpvizClient(redis=c)
    c.flushdb()


@pytest.fixture(scope="module")
def regression(tmp_path_factory, redis_url, client):
    """train_regression.py (DataLoader, MSE, no_sync accumulation) attached (with `--probe`) and plain."""
    tmp = tmp_path_factory.mktemp("regression")
    cmd = torchrun("train_regression.py", "--epochs", "1", "--accum", "2")
    plain = run_plain(cmd, tmp / "plain.json")
    assert plain.returncode == 0, plain.stderr[-3000:]
    proc, run_id = run_attached(cmd, redis_url, tmp / "att.json", tmp / "spool", "--name", "regression", "--probe")
    return dict(tmp=tmp, proc=proc, run_id=run_id, events=read_all_events(client, run_id),
                record=client.get_run(run_id))


def test_an_attached_run_succeeds_and_passes_output_and_exit_code_through(regression):
    proc, rec = regression["proc"], regression["record"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "loss" in proc.stdout  # the script's own lines reach our stdout
    assert "watch it in the app (http://127.0.0.1:8599, Live)" in proc.stderr  # where `up` said it is
    assert rec["status"] == "succeeded"
    assert rec["label"] == "regression"
    assert rec["config"]["attached"] is True and rec["config"]["world_size"] == 2
    started = rec["started"]
    assert started["attached"] is True and started["script"] == "train_regression.py"
    assert "train_regression.py" in " ".join(started["command"])
    types = [e["type"] for e in regression["events"]]
    assert types[0] == "run_started" and types[-1] == "run_finished"


def test_steps_micro_steps_and_losses_match_the_scripts_own_counts(regression):
    mine = reports(regression["tmp"] / "att.json")
    steps = by_rank(regression["events"], "step")
    for rank in (0, 1):
        rows = sorted(steps[rank], key=lambda e: e["step"])
        assert [e["step"] for e in rows] == list(range(mine[rank]["steps"]))
        assert sum(e["micro_steps"] for e in rows) == mine[rank]["micro_steps"]
        # the script all-reduces on one micro-step per optimizer step and uses no_sync() for the rest
        assert sum(e["no_sync_micro_steps"] for e in rows) == mine[rank]["micro_steps"] - mine[rank]["steps"]
        assert [e["loss"] for e in rows] == pytest.approx(mine[rank]["losses"], rel=1e-9)
        assert all(e["forward_s"] > 0 and e["backward_s"] >= 0 and e["optimizer_s"] > 0 for e in rows)
    assert regression["record"]["summary"]["steps_done"] == mine[0]["steps"]


def test_buckets_match_ddps_own_logging_data(regression):
    mine = reports(regression["tmp"] / "att.json")
    buckets = by_rank(regression["events"], "bucket")
    for rank in (0, 1):
        log = mine[rank]["ddp_logging"]
        names = mine[rank]["param_names"]
        last = max(e["step"] for e in buckets[rank])
        rows = sorted((e for e in buckets[rank] if e["step"] == last), key=lambda e: e["bucket_index"])
        assert [e["nbytes"] for e in rows] == ints(log["rebuilt_bucket_sizes"])
        expected = [[names[int(i)] for i in group.split()] for group in log["rebuilt_per_bucket_param_indices"].split(",")]
        layout = {}
        for e in sorted(buckets[rank], key=lambda e: e["step"]):
            if "param_names" in e:
                layout[e["bucket_index"]] = e["param_names"]
        assert [layout[i] for i in range(len(rows))] == expected
        # the default on gloo is the recorder (no comm hook): a steady step's buckets are ready at DDP's reducer
        # stamps, their all-reduces untimed; the sampled steps (0-2) have the profiler's full spans
        assert all(e["ready_s"] is not None and e["comm_start_s"] is None and not e.get("sampled") for e in rows)
        sampled = [e for e in buckets[rank] if e.get("sampled")]
        assert {e["step"] for e in sampled} == {0, 1, 2}
        assert all(e["ready_s"] <= e["comm_start_s"] <= e["comm_end_s"] for e in sampled)
    preview = regression["record"]["started"]["bucket_preview"]
    log0 = mine[0]["ddp_logging"]
    assert [b["nbytes"] for b in preview["initial"]] == ints(log0["bucket_sizes"])
    assert [b["nbytes"] for b in preview["rebuilt"]] == ints(log0["rebuilt_bucket_sizes"])
    assert preview["bucket_cap_bytes"] == log0["bucket_cap_bytes"]


def test_probe_after_the_last_step_covers_the_runs_bucket_sizes(regression):
    """`--probe`: one `allreduce_probe` from rank 0, after every step, on the script's own group
    (world size 2, gloo), whose sizes span DDP's own bucket sizes (`_get_ddp_logging_data()`)."""
    events = regression["events"]
    probes = [e for e in events if e["type"] == "allreduce_probe"]
    assert len(probes) == 1 and probes[0]["rank"] == 0
    probe = probes[0]
    assert probe["world_size"] == 2 and probe["backend"] == "gloo"
    sizes = [p["nbytes"] for p in probe["points"]]
    assert sizes == sorted(sizes) and all(p["time_s"] > 0 for p in probe["points"])
    mine = reports(regression["tmp"] / "att.json")
    buckets = ints(mine[0]["ddp_logging"]["rebuilt_bucket_sizes"]) + ints(mine[0]["ddp_logging"]["bucket_sizes"])
    assert sizes[0] <= min(buckets) and sizes[-1] >= max(buckets), (sizes, buckets)
    rebuilt = ints(mine[0]["ddp_logging"]["rebuilt_bucket_sizes"])  # DDP's own, after its rebuild
    assert probe["run_nbytes"] and set(probe["run_nbytes"]) <= set(rebuilt), (probe["run_nbytes"], rebuilt)
    assert {min(rebuilt), max(rebuilt)} <= set(probe["run_nbytes"])  # probed first, smallest and largest kept
    assert probe["ts"] > max(e["ts"] for e in events if e["type"] == "step")  # after both ranks' last step


def test_trained_parameters_are_bitwise_those_of_the_script_without_ddpviz(regression):
    assert_params_bitwise_equal(regression["tmp"])


def test_memory_is_sampled_on_both_ranks(regression):
    memory = by_rank(regression["events"], "memory")
    for rank in (0, 1):
        assert {e["step"] for e in memory[rank]} >= {0, 1, 2}
        assert all(e["peak_allocated_bytes"] > 0 and e["source"] == "tensors" for e in memory[rank])
        # the parameters alone are alive the whole step: the ledger's peak holds at least them
        assert all(e["breakdown"].get("params", 0) >= regression["record"]["started"]["grad_bytes"]
                   for e in memory[rank])


def test_a_scripts_own_fp16_comm_hook_is_wrapped_not_replaced(tmp_path, redis_url, client):
    cmd = torchrun("train_fp16_hook.py", "--steps", "6")
    plain = run_plain(cmd, tmp_path / "plain.json")
    assert plain.returncode == 0, plain.stderr[-3000:]
    # the default (auto) gives a gloo DDP the recorder, until the script registers its own Python hook (this one):
    # then ddpviz's hook wraps it (`Watch.take_hook_path`), so what the hook sends is measured
    proc, run_id = run_attached(cmd, redis_url, tmp_path / "att.json", tmp_path / "spool")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):  # training is what the script's hook makes it
        a, b = params(tmp_path / "att.json", rank), params(tmp_path / "plain.json", rank)
        assert all(torch.equal(a[n], b[n]) for n in a)
    events = read_all_events(client, run_id)
    mine = reports(tmp_path / "att.json")
    buckets = by_rank(events, "bucket")
    for rank in (0, 1):
        last = max(e["step"] for e in buckets[rank])
        rows = sorted((e for e in buckets[rank] if e["step"] == last), key=lambda e: e["bucket_index"])
        fp32 = ints(mine[rank]["ddp_logging"]["rebuilt_bucket_sizes"])
        assert [e["nbytes"] for e in rows] == [n // 2 for n in fp32]  # fp16 on the wire
        assert [e["uncompressed_nbytes"] for e in rows] == fp32
        assert all("comm hook" in e["nbytes_source"] for e in rows)
        assert len(by_rank(events, "step")[rank]) == mine[rank]["steps"]
    assert client.get_run(run_id)["started"]["config"]["comm_hook"] == "fp16_compress_hook"


def test_two_launchers_of_one_nnodes_2_job_make_one_run(tmp_path, redis_url, client):
    """examples (d): the same script across `--nnodes 2` on one machine, two torchrun launchers
    meeting at a c10d rendezvous, each under its own `ddpviz run` (the second `--join`s)."""
    import subprocess

    from attach_tools import EXAMPLES, run_id_in
    from wtools import cli_env, ddpviz_argv

    from ddpviz.workers.connection import free_port

    tmp = tmp_path
    port = free_port()

    def node(i: int) -> list[str]:
        import sys
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                "--node-rank", str(i), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                "--rdzv-id", "attach-nnodes", str(EXAMPLES / "train_regression.py"), "--epochs", "1", "--accum", "2"]

    env = cli_env(redis_url, TRAIN_REPORT=str(tmp / "nodes.json"))
    first = subprocess.Popen([*ddpviz_argv(), "run", "--spool", str(tmp / "n0"), "--", *node(0)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    run_id = None
    while run_id is None:
        line = first.stderr.readline()
        assert line, "the first launcher ended before printing its run id"
        run_id = run_id_in(line)
    second = subprocess.run([*ddpviz_argv(), "run", "--join", run_id, "--spool", str(tmp / "n1"), "--", *node(1)],
                            env=env, capture_output=True, text=True, timeout=600)
    if second.returncode != 0:  # node 0's torchrun would wait out its 300 s exit barrier for node 1
        first.terminate()
        _, err = first.communicate(timeout=60)
        pytest.fail(f"node 1 exited {second.returncode}:\n{second.stderr[-3000:]}\nnode 0:\n{err[-2000:]}")
    _, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-2000:]
    rec = client.get_run(run_id)
    assert rec["status"] == "succeeded" and rec["started"]["nnodes"] == 2
    mine = reports(tmp / "nodes.json")
    steps = by_rank(read_all_events(client, run_id), "step")
    for rank in (0, 1):
        assert sorted(e["step"] for e in steps[rank]) == list(range(mine[rank]["steps"]))
        assert [e["loss"] for e in sorted(steps[rank], key=lambda e: e["step"])] == pytest.approx(
            mine[rank]["losses"], rel=1e-9)
    assert rec["summary"]["steps_done"] == mine[0]["steps"]
