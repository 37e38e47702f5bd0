"""Imported by the rank fork server alone (`engine.modes.ranks.FORK_SERVER_PRELOAD`, first, before
torch), never elsewhere: it ties the fork server's life to the process that started it.

multiprocessing's fork server lives while any of its clients lives, and hands each rank it forks
the write end of its liveness pipe, so it outlives a launcher that dies while ranks still run; the
ranks, children of the server, would then never see their parent die. With this import the server
exits within `WATCH_INTERVAL_S` of its launcher's death, and each rank, whose own parent-death
signal is set on the server (`engine.modes.ranks.run_rank`), goes with it.

Not prctl(PR_SET_PDEATHSIG) here: Linux sends that signal when the *thread* that forked the
process exits, and the server is started by whichever launcher thread first needs it — a run
launched from a thread would kill the server, and every later run's ranks, when that thread
ends. A daemon thread compares the parent pid with the launcher's instead (`PARENT_ENV`, set by
`engine.modes.ranks.prepare_fork_server`); it imports only the standard library and runs first,
before the server spends seconds importing torch, so a launcher that dies meanwhile (a job
timeout) does not leave the server importing on. Ranks forked later do not inherit the thread.
"""

import os
import threading
import time

from ddpviz.engine.components.lifetime import PARENT_ENV

WATCH_INTERVAL_S = 0.1

_parent = int(os.environ[PARENT_ENV]) if os.environ.get(PARENT_ENV, "").isdigit() else os.getppid()


def _watch() -> None:
    while True:
        if os.getppid() != _parent:
            os._exit(1)
        time.sleep(WATCH_INTERVAL_S)


if os.getppid() != _parent:
    os._exit(1)
threading.Thread(target=_watch, name="ddpviz-parent-watch", daemon=True).start()
