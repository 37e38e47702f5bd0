"""A rank's environment (`engine.modes.ranks.rank_environ`): the launcher's, with the elastic agent's
per-rank variables always winning. The CI failure it fixes: an earlier in-process process group left
MASTER_PORT in the test process's environment, that stale value replaced the agent's, and every later
run's ranks timed out connecting to a store nobody served ("connect to (127.0.0.1, 38133)")."""

from __future__ import annotations

import pytest

from ddpviz.engine.config import RunConfig
from ddpviz.engine.modes.launcher import free_port
from ddpviz.engine.modes.ranks import rank_environ
from ddpviz.engine.run import run_training

FORKED = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
          "MASTER_PORT": "40001", "TORCHELASTIC_RUN_ID": "now", "PATH": "/fork-server-start",
          "NCCL_DEBUG": "WARN", "OLD_ONLY": "x"}


def test_the_agents_variables_win_over_stale_ones_in_the_launchers_environment():
    launcher = {"PATH": "/now", "MASTER_PORT": "38133", "RANK": "0", "TORCHELASTIC_RUN_ID": "old",
                "GROUP_RANK": "5", "NCCL_DEBUG": "INFO", "USER_VAR": "1"}
    env = rank_environ(FORKED, launcher)
    assert env["MASTER_PORT"] == "40001" and env["RANK"] == "1" and env["TORCHELASTIC_RUN_ID"] == "now"
    assert "GROUP_RANK" not in env  # the agent did not set it for this rank: a stale one is dropped
    assert env["PATH"] == "/now" and env["USER_VAR"] == "1"  # the launcher's environment otherwise
    assert env["NCCL_DEBUG"] == "INFO"  # the user's NCCL setting, as the launcher has it now
    assert "OLD_ONLY" not in env  # the fork server's start-up leftovers are gone


def test_the_nccl_settings_the_launcher_lacks_come_from_the_fork():
    assert rank_environ(FORKED, {"PATH": "/now"})["NCCL_DEBUG"] == "WARN"


@pytest.mark.slow
def test_a_run_succeeds_with_a_stale_master_port_in_the_launchers_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))  # nobody serves a store there
    cfg = RunConfig(model="mlp", dataset="digits", width=16, depth=1, global_batch_size=32, steps=3,
                    eval_every=0, mode="ddp", world_size=2, probe=False, collective_timeout_s=15)
    result = run_training(cfg, type("Quiet", (), {"emit": lambda s, e: None, "close": lambda s: None})(),
                          "stale-port", workdir=tmp_path)
    assert result.status == "succeeded", result.error


def test_the_rank_profiler_writes_its_stats_and_never_raises(tmp_path, capsys):
    """`DDPVIZ_PROFILE_RANK` (a diagnostic of ddpviz's own Python time in a rank): stats a reader can load, and a
    folder it cannot write said on stderr, not raised (it runs in the rank's `finally`)."""
    import pstats

    from ddpviz.engine.modes.ranks import _profiler

    assert _profiler(None, 0) is None and _profiler("", 0) is None
    stop = _profiler(str(tmp_path / "p"), 3)
    sum(i * i for i in range(1000))
    stop()
    assert pstats.Stats(str(tmp_path / "p" / "rank3.pstats")).total_calls > 0
    (tmp_path / "file").write_text("")
    _profiler(str(tmp_path / "file" / "sub"), 0)()  # a file where the folder should be
    assert "could not write" in capsys.readouterr().err
