"""A rank's process group is really gone after `destroy_process_group()`: no gloo thread outlives it
into interpreter shutdown, where an unjoined std::thread aborts the rank with SIGABRT
("terminate called without an active exception") while its peers still finalize.

The cause (engine/modes/ranks.py): DDP's constructor imports torch._dynamo, which imports
torch.distributed.nn.functional, whose `group=group.WORLD` defaults capture the live WORLD group
when imported after `init_process_group`. The reference side does the same work with a plain
`init_process_group` leaves gloo's run loops alive on torch 2.13 (run the script with "plain" to see
them); the engine's side must show none.

And a DDP still alive when the group goes (a failing rank's traceback holds its frames; a script's
`main()` ends with `destroy_process_group()` before its locals go) must not keep the group: its
reducer would free it later holding the GIL while a gloo worker waits on the GIL (a hang at the
end, 1 in ~40 two-rank reference runs; `engine.modes.ranks.leave_process_group` explains). The
engine's `leave_process_group` must leave no gloo thread with the DDP alive ("plain" keeps them:
its reducer still holds the group).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import gc, os, sys, tempfile
    import torch
    import torch.distributed as dist
    if sys.argv[1] == "engine":
        from ddpviz.engine.modes.ranks import join_process_group, leave_process_group
    else:
        join_process_group, leave_process_group = dist.init_process_group, dist.destroy_process_group
    from torch.nn.parallel import DistributedDataParallel as DDP
    join_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
    model = DDP(torch.nn.Linear(4, 4))
    model(torch.randn(2, 4)).sum().backward()
    leave_process_group()  # the DDP still alive, as in a failing rank's traceback
    gc.collect()
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    print(",".join(sorted(n for n in names if "gloo" in n)))
""")


def test_no_gloo_thread_outlives_leave_process_group_in_a_rank_even_with_a_ddp_alive():
    out = subprocess.run([sys.executable, "-c", SCRIPT, "engine"], capture_output=True, text=True, check=True,
                         timeout=120)
    assert out.stdout.strip() == ""  # the names of gloo threads still alive, comma-separated
