"""Fixtures shared by the engine tests.

models: the test models of `memory_models.py` registered as `ddpviz.models` plugins (a dist-info in
a temporary folder on sys.path, removed after the module), for tests that train them by name.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    sys.path[:0] = [str(root), str(HERE)]
    import memory_models as mm
    mm.installed(root)
    yield mm
    sys.path.remove(str(root))
    sys.path.remove(str(HERE))


@pytest.fixture(scope="module")
def field_plugins(tmp_path_factory):
    """The field-case models of `field_models.py` registered as `ddpviz.models` plugins for one
    module (use as ``pytestmark = pytest.mark.usefixtures("field_plugins")``)."""
    import field_models

    root = tmp_path_factory.mktemp("field-site")
    field_models.install(root)
    yield field_models
    field_models.uninstall(root)
