"""An attached run (`ddpviz run -- torchrun ...`, no `group`) is offered by every analysis page's
run-set chooser and drawn there, on the recorded real one (tests/app/data, recorded.ATTACHED)."""

from __future__ import annotations

import pytest
from recorded import play_attached

PAGES = {"views/buckets.py": "buckets_set", "views/compare.py": "compare_set",
         "views/theory.py": "theory_set", "views/learn.py": "learn_set"}


@pytest.mark.parametrize("page, key", PAGES.items())
def test_every_chooser_offers_the_attached_run(real_client, app_test, page, key):
    rid = play_attached(real_client)
    at = app_test(page)
    assert not at.exception, [e.value for e in at.exception]
    chooser = at.selectbox(key=key)
    assert chooser.value == rid  # the only set there is, chosen
    assert any(rid[:12] in o for o in chooser.options), chooser.options
    assert not any("No " in i.value and "yet" in i.value for i in at.info)  # not the empty state
