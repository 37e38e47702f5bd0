"""`ddpviz run -- torchrun ... train_fsdp2.py`: an unmodified FSDP2 script attached (issue 24, example b).

Checked against independent references: the script's own step counter and losses, the bytes of
each FSDP unit's parameters as the script computed them before sharding (numel x element size;
the example's dims are even, so FSDP2 pads nothing on 2 ranks), and the same script run without
ddpviz (same seed: full parameters bitwise equal). The script gives its first block an all-gather
of its own (`--own-all-gather`, FSDP2's `set_custom_all_gather`) that counts its calls: those
calls are recorded as that block's, named, and counted against the script's own count.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
from attach_tools import assert_params_bitwise_equal, by_rank, reports, run_attached, run_plain, torchrun

from ddpviz.workers.client import DdpvizClient
from ddpviz.workers.connection import connect
from ddpviz.workers.history import read_all_events

pytestmark = pytest.mark.slow
STEPS = 4


@pytest.fixture(scope="module")
def fsdp2(tmp_path_factory, redis_url):
    c = connect(redis_url)
    c.flushdb()
    client = DdpvizClient(redis=c)
    tmp = tmp_path_factory.mktemp("fsdp2")
    cmd = torchrun("train_fsdp2.py", "--steps", str(STEPS), "--own-all-gather")
    plain = run_plain(cmd, tmp / "plain.json")
    assert plain.returncode == 0, plain.stderr[-3000:]
    proc, run_id = run_attached(cmd, redis_url, tmp / "att.json", tmp / "spool", "--name", "fsdp2")
    yield dict(tmp=tmp, proc=proc, events=read_all_events(client, run_id), record=client.get_run(run_id),
               mine=reports(tmp / "att.json"))
    c.flushdb()


def test_the_fsdp2_run_succeeds_as_an_fsdp_run(fsdp2):
    proc, rec = fsdp2["proc"], fsdp2["record"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "instrumentation off" not in proc.stderr and "not recorded" not in proc.stderr, proc.stderr[-3000:]
    assert rec["status"] == "succeeded"
    assert rec["started"]["mode"] == "fsdp" and rec["started"]["script"] == "train_fsdp2.py"


def test_steps_and_losses_match_the_scripts_own_counts(fsdp2):
    steps = by_rank(fsdp2["events"], "step")
    for rank in (0, 1):
        rows = sorted(steps[rank], key=lambda e: e["step"])
        assert [e["step"] for e in rows] == list(range(fsdp2["mine"][rank]["steps"]))
        assert [e["loss"] for e in rows] == pytest.approx(fsdp2["mine"][rank]["losses"], rel=1e-9)
        assert all(e["micro_steps"] == 1 and e["no_sync_micro_steps"] == 0 for e in rows)
        assert all(e["comm_exposed_measured"] is True and e["comm_exposed_s"] > 0 for e in rows)


def test_each_units_collectives_carry_the_bytes_of_its_parameters(fsdp2):
    """Per sampled step (0-2) and rank: every unit all-gathered in forward, every unit but the
    root again in backward (FSDP2 reshards blocks after forward, not the root), and
    reduce-scattered once, each with the bytes of the unit's parameters as the script counted them."""
    colls = by_rank(fsdp2["events"], "fsdp_collective")
    for rank in (0, 1):
        units = fsdp2["mine"][rank]["units"]
        world = fsdp2["mine"][rank]["world_size"]
        per_step = defaultdict(list)
        for e in colls[rank]:
            per_step[e["step"]].append(e)
        assert sorted(per_step) == [0, 1, 2]
        for step, rows in per_step.items():
            count = Counter((e["unit"], e["kind"], e["phase"]) for e in rows)
            expected = Counter({(u, "all_gather", "forward"): 1 for u in units})
            expected.update({(u, "all_gather", "backward"): 1 for u in units if u != "root"})
            expected.update({(u, "reduce_scatter", "backward"): 1 for u in units})
            assert count == expected, step
            own = [e for e in rows if e.get("comm") is not None]  # the script's own all-gather's calls
            assert {(e["unit"], e["kind"], e["comm"]) for e in own} == {("blocks.0", "all_gather", "CountingAllGather")}
            assert len(own) == fsdp2["mine"][rank]["own_all_gather_calls"][step] == 2  # forward and backward
            for e in rows:
                assert e["nbytes"] == units[e["unit"]]["nbytes"], e
                assert e["shard_nbytes"] * world == e["nbytes"]
                assert 0 <= e["start_s"] <= e["end_s"]
        volumes = {e["step"]: e for e in fsdp2["events"] if e["type"] == "comm_volume" and e["rank"] == rank}
        assert volumes[0]["all_gather_nbytes"] == sum(e["nbytes"] for e in per_step[0] if e["kind"] == "all_gather")


def test_run_started_names_the_units_the_script_sharded(fsdp2):
    units = {u["unit"]: u for u in fsdp2["record"]["started"]["fsdp_units"]["units"]}
    mine = fsdp2["mine"][0]["units"]
    assert units.keys() == mine.keys()
    for name, u in units.items():
        assert u["param_names"] == mine[name]["params"]
        assert u["gather_bytes"] == mine[name]["nbytes"]


def test_trained_parameters_are_bitwise_those_of_the_script_without_ddpviz(fsdp2):
    assert_params_bitwise_equal(fsdp2["tmp"])
