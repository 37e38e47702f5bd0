"""ddpviz's startup hook: `ddpviz run` puts this folder first on PYTHONPATH, so every Python
process the user's command starts imports this file at start-up (the `site` module imports
`sitecustomize`, https://docs.python.org/3/library/site.html).

It first runs the sitecustomize that would have run without ddpviz (the next one on sys.path),
then, only in a training process of an attached run (`engine.attach.env.should_instrument`),
installs the instrumentation (`engine.attach.install`). Whatever fails here is reported in one
line and ignored: the user's program starts as it would have.
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
    import sys

    try:
        _chain_next_sitecustomize()
    except Exception as exc:  # the user's own sitecustomize failed: Python reports it the same way
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}",
              file=sys.stderr)
    try:
        from ddpviz.engine.attach.env import should_instrument

        if should_instrument():
            from ddpviz.engine.attach import install

            install()
    except Exception as exc:  # fail open: training starts uninstrumented
        print(f"ddpviz: instrumentation off in this process ({type(exc).__name__}: {exc})",
              file=sys.stderr, flush=True)


_start()
