"""Your own model: packages register models under the `ddpviz.models` entry-point group.

An entry point names a `ModelPlugin` (or any object with the same two callables). A job carries
only the name; the worker that runs it must have the package installed. Example (pyproject.toml)::

    [project.entry-points."ddpviz.models"]
    tinyresnet = "my_pkg.ddpviz_plugin:plugin"
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import torch.nn as nn

from ddpviz.engine.config import RunConfig

GROUP = "ddpviz.models"


@dataclass(frozen=True)
class ModelPlugin:
    """A model and the batches it trains on.

    Attributes:
        build: `cfg -> nn.Module`; logits over the last dimension (cross-entropy is the loss).
            Called on every rank after `torch.manual_seed(cfg.seed)`, so it must be deterministic.
        dataset: `cfg -> engine.data.Dataset` (train/validation tensors).
        description: one line for the Launch form.
    """

    build: Callable[[RunConfig], nn.Module]
    dataset: Callable[[RunConfig], object]
    description: str = ""


@lru_cache(maxsize=None)
def load_plugin(name: str) -> ModelPlugin:
    """The plugin registered as `name`.

    Raises:
        KeyError: no entry point of that name in the `ddpviz.models` group.
    """
    from importlib.metadata import entry_points

    for ep in entry_points(group=GROUP):
        if ep.name == name:
            return ep.load()
    raise KeyError(f"model must be a built-in or a registered '{GROUP}' plugin (got {name!r})")
