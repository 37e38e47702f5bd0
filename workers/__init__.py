"""ddpviz workers: Redis + RQ between the app and the engine. Imports no app, no Streamlit.

The map of this folder:
    client      the API the app and the CLI use: submit, watch, cancel (no torch)
    worker      the RQ worker on queue ``ddpviz``, one run at a time
    store       run records (one hash per run, an index by time)   keys   every Redis key
    sink        the Redis stream a run writes its events into       connection  URL, client, embedded Redis
    spool       an attached run's event files (``ddpviz run``), sent to its stream now or later
    attached    an attached run's record: created, ended, its failure from torchrun's error file
    heartbeat, liveness   who serves the queue; runs whose worker died
    retention, history    which old runs go; delete, rerun, read a whole stream
    sweeps      sets of runs launched together         scaleout, scaleout_text   the Scale-out report
    tunes       stored ``ddpviz tune`` searches: the trials as runs, the report (the app's Tune page)
    up          ``ddpviz up``: Redis, workers and the app on one machine
    jobs/       the RQ jobs (a run, a multi-host node)  host/   this host's GPUs, leases, processes
    cli/        the ``ddpviz`` command                   doctor/ ``ddpviz doctor``
    bench/      ``ddpviz bench``

Importing this package points RQ at ddpviz's key prefix (``ddpviz:rq``) before RQ is imported,
so every key ddpviz writes, RQ's included, lives under ``ddpviz:``. The variable is exported
through the environment, so worker subprocesses inherit it.

Raises:
    ImportError: if RQ was imported earlier in this process with another key prefix (the client
        and the workers would then look at different queues).
"""

from __future__ import annotations

import os
import sys

from ddpviz.workers.keys import RQ_KEY_PREFIX

os.environ["RQ_KEY_PREFIX"] = RQ_KEY_PREFIX
if "rq.defaults" in sys.modules and sys.modules["rq.defaults"].RQ_KEY_PREFIX != RQ_KEY_PREFIX:
    raise ImportError(
        f"rq was imported before workers with key prefix "
        f"{sys.modules['rq.defaults'].RQ_KEY_PREFIX!r}; import workers first (or set "
        f"RQ_KEY_PREFIX={RQ_KEY_PREFIX}) so ddpviz's queue keys live under 'ddpviz:'")
