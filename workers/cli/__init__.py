"""The ``ddpviz`` command (console script ``workers.cli:main``).

    commands   the parser and the commands that go through Redis: up, worker, submit, train, ...
    local      commands that run the engine here: compare, bench, preview, probe
    attach     ``ddpviz run -- COMMAND``: watch a training command ddpviz did not write
    command_env  the environment `run` and `tune` give the command they start
    upload     ``ddpviz upload SPOOL``: an attached run's spooled events sent to Redis, then the spool removed
    export     ``ddpviz export``: a run's events as JSONL, CSV or a Chrome trace
    predict    ``ddpviz predict RUN_ID``: the Scale-out page's report on the command line
    tune       ``ddpviz tune -- COMMAND``: DDP settings tried against the script's own, predicted and measured
    tune_report  ``ddpviz tune``'s terminal answer (rich)
    flags      a command-line flag for every `RunConfig` field, generated
    exits      exit codes: 0 done, 1 failed, 2 refused
    progress   terminal progress for a run, fed by its events
"""

from ddpviz.workers.cli.commands import main

__all__ = ["main"]
