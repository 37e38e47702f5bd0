"""Imported by the rank fork server alone (`engine.modes.ranks.FORK_SERVER_PRELOAD`, first, before
torch), never elsewhere: it ties the fork server's life to the process that started it.

multiprocessing's fork server lives while any of its clients lives, and hands each rank it forks
the write end of its liveness pipe, so it outlives a launcher that dies while ranks still run; the
ranks, children of the server, would then never see their parent die. With this import the kernel
kills the server when its launcher dies (prctl PR_SET_PDEATHSIG), and each rank, whose own death
signal is set on the server (`engine.modes.ranks.run_rank`), goes with it.

It imports only the standard library and runs first: the server's other preloads (torch and the
rank code) take seconds, many on a busy machine, and a launcher that dies meanwhile (a job
timeout) must not leave the server importing on, re-parented, holding the run's environment. The
launcher's pid comes in `PARENT_ENV`; a server whose parent is already another exits at once.
"""

import os

from engine.components.lifetime import PARENT_ENV, die_with_parent

die_with_parent(int(os.environ[PARENT_ENV]) if os.environ.get(PARENT_ENV, "").isdigit() else None)
