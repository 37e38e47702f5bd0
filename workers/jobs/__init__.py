"""The RQ jobs a worker runs, and how their endings are recorded.

    run        `execute_run`: one training run (single, DP, DDP, FSDP on this host)
    multinode  a run with ``nnodes > 1`` becomes one node job per host
    node       `execute_node`: one host's part of a multi-host DDP run
    nodes      the shared state of a multi-host run's node jobs and how they end as one run
    pair       `execute_pair`: a DP+DDP pair trained at once, taking turns of blocks of steps

RQ stores a job's function by name; the names it is given are this package's
(`workers.jobs.execute_run`, `execute_node`, `execute_pair`, `on_job_stopped`), re-exported here.
"""

from ddpviz.workers.jobs.node import execute_node
from ddpviz.workers.jobs.pair import execute_pair
from ddpviz.workers.jobs.run import execute_run, on_job_stopped

__all__ = ["execute_node", "execute_pair", "execute_run", "on_job_stopped"]
