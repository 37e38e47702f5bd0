"""ddpviz's constructor wrappers, invisible to the warnings the constructors they wrap issue.

A constructor ddpviz wraps (`DistributedDataParallel.__init__`, `nn.DataParallel.__init__`) warns with
`stacklevel=2` to name the script's line that called it (torch 2.13: "`broadcast_buffers` is deprecated",
on every `DDP(..., broadcast_buffers=False)`). Called through a wrapper, stack level 2 is the wrapper's frame:
the script would see the warning filed under `engine/attach/ddp.py`, in ddpviz's registry (so printed once for all
of the script's call sites, where plain Python prints it once per call site) and matched against ddpviz's module
by the script's own `warnings.filterwarnings(module=...)`.

So while a wrapped constructor runs (`past_wrappers`), `warnings.warn` is a shim: a call made directly from the
constructor's own code counts its `stacklevel` in frames that are not ddpviz's wrappers (`wrapper` registers
them), and every other call (another thread's, a helper's) goes through unchanged. `warnings.warn` is the
module attribute torch's code looks up at each call (`warnings.warn(...)` in torch/nn/parallel/distributed.py),
the function Python's own `warnings` documentation says a `stacklevel` belongs to. The shim is removed when the
last wrapped constructor returns; a shim ddpviz cannot work out falls back to the warning's own stacklevel.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import threading
import warnings
from types import CodeType, FrameType
from typing import Any, Callable, Iterator

_WRAPPERS: set[CodeType] = set()  # the code of ddpviz's wrapper frames, skipped in a stacklevel's count
_INNER: dict[CodeType, int] = {}  # the wrapped constructors running now (code -> how many)
_LOCK = threading.Lock()
_SHIM: dict[str, Any] = {"depth": 0, "real": None}


def wrapper(fn: Callable) -> Callable:
    """Register `fn`, a ddpviz wrapper of a constructor, as a frame a warning's stacklevel skips; returns `fn`."""
    _WRAPPERS.add(fn.__code__)
    return fn


def target_level(frame: FrameType, stacklevel: int) -> int:
    """The stacklevel for `warnings.warn` called from the shim (one frame below `frame`) that names the frame
    `stacklevel - 1` frames above `frame`, not counting ddpviz's wrapper frames (`wrapper`)."""
    need, steps, f = stacklevel - 1, 0, frame
    while need > 0 and f is not None:
        f = f.f_back
        steps += 1
        if f is not None and f.f_code not in _WRAPPERS:
            need -= 1
    return steps + 2  # the shim's own frame, then `frame`


def _warn(message: Any, category: Any = None, stacklevel: int = 1, source: Any = None, *args: Any,
          **kwargs: Any) -> None:
    real = _SHIM["real"]
    level = stacklevel + 1 if isinstance(stacklevel, int) else stacklevel  # this frame, for everyone else
    try:
        caller = sys._getframe(1)
        if caller.f_code in _INNER and isinstance(stacklevel, int) and stacklevel >= 1:
            level = target_level(caller, stacklevel)
    except Exception:  # fail open: the warning's own stacklevel, one more for this frame
        pass
    return real(message, category, level, source, *args, **kwargs)


@contextlib.contextmanager
def past_wrappers(constructor: Callable) -> Iterator[None]:
    """While the block runs, warnings issued by `constructor`'s own code (the function under any
    `functools.wraps` layers) count their stacklevel past ddpviz's wrapper frames (module docstring)."""
    code = getattr(inspect.unwrap(constructor), "__code__", None)
    if code is None:
        yield
        return
    with _LOCK:
        if _SHIM["depth"] == 0:
            _SHIM["real"], warnings.warn = warnings.warn, _warn
        _SHIM["depth"] += 1
        _INNER[code] = _INNER.get(code, 0) + 1
    try:
        yield
    finally:
        with _LOCK:
            _INNER[code] -= 1
            if not _INNER[code]:
                del _INNER[code]
            _SHIM["depth"] -= 1
            if _SHIM["depth"] == 0 and warnings.warn is _warn:  # a script that replaced it since keeps its own
                warnings.warn = _SHIM["real"]
