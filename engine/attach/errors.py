"""The failing rank's exception, where torchrun looks for it.

torch.distributed.elastic gives each worker its own `TORCHELASTIC_ERROR_FILE`; a worker whose
main is decorated with `@record` writes its uncaught exception there, and torchrun (itself
`@record`) copies the first failure's file to its own `TORCHELASTIC_ERROR_FILE`
(torch/distributed/elastic/multiprocessing/errors). A user's script is rarely decorated, so
`install_excepthook` writes the same file from `sys.excepthook`, in the same JSON shape
(`ErrorHandler.record_exception`), with the rank added under ``extraInfo``; `ddpviz run` reads it.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


def error_payload(exc: BaseException, rank: int) -> dict:
    """The error file's JSON: ``{"message": {"message", "extraInfo": {py_callstack, timestamp, rank}}}``."""
    return {"message": {"message": f"{type(exc).__name__}: {exc}",
                        "extraInfo": {"py_callstack": "".join(traceback.format_exception(exc)),
                                      "timestamp": str(int(time.time())), "rank": rank}}}


def install_excepthook(rank: int) -> None:
    """Write an uncaught exception to this worker's `TORCHELASTIC_ERROR_FILE` (unless something,
    e.g. `@record`, wrote one already), then call the previous hook."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        try:
            path = os.environ.get("TORCHELASTIC_ERROR_FILE")
            if path and not os.path.exists(path) and isinstance(exc, Exception):
                with open(path, "w") as fh:
                    json.dump(error_payload(exc.with_traceback(tb), rank), fh)
        except Exception:
            pass
        previous(exc_type, exc, tb)

    sys.excepthook = hook
