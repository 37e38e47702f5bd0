"""Models from the `ddpviz.models` entry-point group: found by name, trained, and pre-flight checked.

The plugins are registered for real: a `*.dist-info` with `entry_points.txt` on sys.path, which is
what `pip install` of a plugin package writes.
"""

import sys
import textwrap
from pathlib import Path

import pytest
import torch

from ddpviz.engine.config import ConfigError, plugin_model_names, validate_config
from ddpviz.engine.events import ListSink
from ddpviz.engine.run import run_training

EXAMPLE_SRC = Path(__file__).resolve().parents[2] / "examples" / "ddpviz_plugin_example" / "src"


@pytest.fixture(scope="module")
def installed_plugins(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    (root / "unused_plugin.py").write_text(textwrap.dedent('''
        import torch.nn as nn
        from ddpviz.engine.data import load_dataset
        from ddpviz.engine.plugins import ModelPlugin

        class WithUnused(nn.Module):
            def __init__(self):
                super().__init__()
                self.used = nn.Linear(64, 10)
                self.forgotten = nn.Linear(64, 10)  # never called in forward

            def forward(self, x):
                return self.used(x)

        plugin = ModelPlugin(build=lambda cfg: WithUnused(),
                             dataset=lambda cfg: load_dataset(cfg.model_copy(update={"model": "mlp"})))
    '''))
    dist = root / "ddpviz_test_plugins-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ddpviz-test-plugins\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[ddpviz.models]\nresmlp = ddpviz_plugin_example:plugin\nwithunused = unused_plugin:plugin\n")
    sys.path[:0] = [str(root), str(EXAMPLE_SRC)]
    yield
    sys.path.remove(str(root))
    sys.path.remove(str(EXAMPLE_SRC))


def test_plugin_names_are_valid_models(installed_plugins):
    assert {"resmlp", "withunused"} <= plugin_model_names()
    assert validate_config({"model": "resmlp", "mode": "single"}).model == "resmlp"
    with pytest.raises(ConfigError, match="resmlp"):  # the refusal lists the plugins too
        validate_config({"model": "nope"})


def test_plugin_model_trains_like_single_under_dp(installed_plugins):
    fields = dict(model="resmlp", width=16, depth=2, global_batch_size=16, steps=3, lr=0.1, optimizer="sgd", eval_every=0)
    dp = run_training(validate_config(dict(mode="dp", **fields)), ListSink(), "a")
    single = run_training(validate_config(dict(mode="single", **fields)), ListSink(), "b")
    assert dp.status == single.status == "succeeded"
    torch.testing.assert_close(dp.final_params, single.final_params, rtol=1e-5, atol=1e-6)


def test_unused_parameter_is_named_before_any_rank_starts(installed_plugins):
    sink = ListSink()
    result = run_training(validate_config(dict(model="withunused", mode="ddp", steps=2)), sink, "u")
    assert result.status == "failed"
    assert "find_unused_parameters" in result.error["exception"]
    assert "forgotten.weight" in result.error["exception"]
    assert [e["type"] for e in sink.events] == ["run_finished"]  # nothing started


@pytest.mark.slow
def test_find_unused_parameters_lets_it_train(installed_plugins):
    cfg = validate_config(dict(model="withunused", mode="ddp", steps=3, eval_every=0,
                               find_unused_parameters=True, global_batch_size=16))
    result = run_training(cfg, ListSink(), "v")
    assert result.status == "succeeded", result.error
