"""A warning DDP's constructor issues (torch 2.13: "`broadcast_buffers` is deprecated", `stacklevel=2`) names the
script's line when attached, as without ddpviz: the same file and line, printed once per call site under the
default filter, and caught by a filter on the script's module. Reference: the same script without ddpviz.
Before 2026-12-06 it named `engine/attach/ddp.py` (ddpviz's wrapper of `DDP.__init__`), so it printed once for
every call site and escaped the script's own filters (engine.attach.transparent)."""

from __future__ import annotations

import pytest
from attach_process import EPILOGUE, PREAMBLE, plain_and_attached

SCRIPT = PREAMBLE + r'''
import warnings

def build(**kw):
    return DDP(torch.nn.Linear(4, 1), **kw)  # the line a warning of build's call names

with warnings.catch_warnings(record=True) as got:
    warnings.simplefilter("default")  # once per location, in the registry of the module it names
    for _ in range(3):
        DDP(torch.nn.Linear(4, 1), broadcast_buffers=False)
        build(broadcast_buffers=True)
for w in got:
    print("W", w.filename, w.lineno, w.category.__name__, str(w.message).split(".")[0])
with warnings.catch_warnings():
    warnings.filterwarnings("error", category=FutureWarning, module="__main__")  # the script's own filter
    try:
        DDP(torch.nn.Linear(4, 1), broadcast_buffers=False)
        print("F not raised")
    except FutureWarning as exc:
        print("F raised", str(exc).split(".")[0])
warnings.warn("the script's own", UserWarning)  # past the constructor: no shim left in place
print("S", warnings.warn.__module__)
''' + EPILOGUE


@pytest.mark.parametrize("tuned", [False, True])
def test_ddps_warnings_name_the_scripts_line_and_meet_its_filters_as_without_ddpviz(tmp_path, tuned):
    # `ddpviz tune`'s trials wrap DDP.__init__ once more (engine.attach.overrides), over the attach wrapper
    script = ('import os; os.environ["DDPVIZ_TUNE_DDP_KWARGS"] = \'{"bucket_cap_mb": 10}\'\n' if tuned else "") + SCRIPT
    plain, attached = plain_and_attached(tmp_path, script, ("W", "F", "S"))
    warned = [line for line in plain if line.startswith("W")]
    assert len(warned) == 2 and all(" <string> " in w and "broadcast_buffers" in w for w in warned), plain
    assert warned[0].split()[2] != warned[1].split()[2]  # two call sites, two lines
    assert "F raised `broadcast_buffers` is deprecated" in plain and "S _warnings" in plain
    assert attached == plain
