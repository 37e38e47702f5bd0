"""Imported by the rank fork server alone (`engine.modes.ranks.FORK_SERVER_PRELOAD`), never
elsewhere: it ties the fork server's life to the process that started it.

multiprocessing's fork server lives while any of its clients lives, and hands each rank it forks
the write end of its liveness pipe, so it outlives a launcher that dies while ranks still run; the
ranks, children of the server, would then never see their parent die. With this import the kernel
kills the server when its launcher dies (prctl PR_SET_PDEATHSIG), and each rank, whose own death
signal is set on the server (`engine.modes.ranks.die_with_parent`), goes with it.
"""

from engine.modes.ranks import die_with_parent

die_with_parent()
