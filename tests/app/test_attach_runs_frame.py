"""The Runs table names attached runs (`ddpviz run`) with their script and host (issue 24)."""

from ddpviz.app.frames import runs as fruns


def test_an_attached_run_shows_its_script_and_host_and_a_launched_one_says_so():
    attached = {"run_id": "a", "config": {"mode": "ddp", "attached": True, "command": ["torchrun", "t.py"]},
                "started": {"attached": True, "script": "train.py", "hostname": "gpu-7"}, "created_at": 2.0}
    queued = {"run_id": "b", "config": {"mode": "ddp", "attached": True, "command": ["torchrun", "t.py"]},
              "started": None, "created_at": 1.0}  # before rank 0's run_started: the command line
    launched = {"run_id": "c", "config": {"mode": "dp"}, "created_at": 0.5}
    df = fruns.runs_frame([attached, queued, launched]).set_index("run_id")
    assert df.loc["a", "source"] == "attached · train.py · gpu-7"
    assert df.loc["b", "source"] == "attached · torchrun t.py"
    assert df.loc["c", "source"] == "launched"


def test_an_attached_run_in_which_nothing_trained_has_no_mode_and_is_named_by_its_command(redis_client):
    """`ddpviz run -- nonexistent_cmd` or a command without a rank: its record never gets a `run_started`, so it has
    no mode (it was listed "ddp", and Live's title read "ddp ×?"); its name is its script, else "attached"."""
    from ddpviz.app.frames.base import run_label
    from ddpviz.workers.attached import create_record
    from ddpviz.workers.client import DdpvizClient

    client = DdpvizClient(redis=redis_client)
    create_record(client.store, "n0thing0trained", ["torchrun", "--nproc-per-node", "2", "train.py"], None)
    rec = client.get_run("n0thing0trained")
    assert "mode" not in rec["config"] and rec["status"] == "started"
    assert run_label(rec, "n0thing0trained") == "train.py · n0thin"
    assert run_label({"config": {"attached": True, "command": ["nonexistent_cmd"]}}, "abcdef12") == "attached · abcdef"
    df = fruns.runs_frame([rec]).set_index("run_id")
    assert df.loc["n0thing0trained", "mode"] is None  # the table shows a dash, not a mode
