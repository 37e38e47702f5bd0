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
