"""ddpviz's startup hook: `ddpviz run` puts this folder first on PYTHONPATH, so every Python
process the user's command starts imports this file at start-up (the `site` module imports
`sitecustomize`, https://docs.python.org/3/library/site.html).

It first runs the sitecustomize that would have run without ddpviz (the next one on sys.path),
then, in a process of an attached run, does what its role asks (`engine.attach.env.process_role`,
`engine.attach.claim`): a rank installs the instrumentation once the script imports torch; any
other process is left alone unless it initialises a process group of its own. Nothing here imports
torch. Whatever fails here is reported in one line and ignored: the user's program starts as it
would have.
"""


def _chain_next_sitecustomize() -> None:
    import importlib
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    mine = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        importlib.import_module("sitecustomize")
    except ModuleNotFoundError as exc:
        if exc.name != "sitecustomize":
            raise
    finally:
        sys.path[:] = saved
        if mine is not None:
            sys.modules["sitecustomize"] = mine


def _start() -> None:
    import os
    import sys

    try:
        _chain_next_sitecustomize()
    except Exception as exc:  # the user's own sitecustomize failed: Python reports it the same way
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}",
              file=sys.stderr)
    if not os.environ.get("DDPVIZ_ATTACH_RUN_ID"):  # not in an attached run: import nothing of ddpviz
        return
    try:
        from ddpviz.engine.attach.env import process_role

        role = process_role()
        if role == "rank":
            from ddpviz.engine.attach.claim import start_rank

            start_rank()
        elif role == "dormant":
            from ddpviz.engine.attach.claim import wait_for_process_group

            wait_for_process_group()
    except ModuleNotFoundError as exc:
        if exc.name != "ddpviz":
            _say_off(exc)
        # else a Python without ddpviz (another installation, a system tool the script runs): silent, as it is
        # without ddpviz; where no process trained instrumented, `ddpviz run` says why (a line in every such process,
        # 2026-12-06)
    except Exception as exc:  # fail open: training starts uninstrumented
        _say_off(exc)


def _say_off(exc: BaseException) -> None:
    import sys

    print(f"ddpviz: instrumentation off in this process ({type(exc).__name__}: {exc})", file=sys.stderr, flush=True)


def _leave_sys_path() -> None:
    """Take this folder off sys.path once this file ran: PYTHONPATH holds it only for Python to find this file at
    start-up (and keeps it for the processes this one starts), and the script's sys.path is then what it is without
    ddpviz (docs/attach.md)."""
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]


_start()
_leave_sys_path()
