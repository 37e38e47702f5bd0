"""Run a function right after a module is first imported, without importing it ourselves.

The attach hook patches what the script will build (FSDP2's state class) but must not import it
at start-up: `torch.distributed.fsdp` takes seconds to import, and most scripts never do.
`after_import` puts a finder first on `sys.meta_path` (https://docs.python.org/3/reference/
import.html#the-meta-path) that, for the one module name, asks the other finders for its spec and
wraps the loader's `exec_module`, so the callback runs once the module's body has run, before
the importer sees it.
"""

from __future__ import annotations

import sys
from typing import Any, Callable


class _AfterImport:  # a meta path finder (find_spec); importlib.abc costs 16 ms to import in every process
    def __init__(self, name: str, callback: Callable[[Any], None]):
        self.name, self.callback = name, callback

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # once; and the lookup below must not find us again
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec
        callback = self.callback

        def exec_then_call(module: Any) -> None:
            exec_module(module)
            callback(module)

        loader.exec_module = exec_then_call
        return spec


def after_import(name: str, callback: Callable[[Any], None]) -> None:
    """`callback(module)` once `name` is imported: now if it already is, else right after its
    first import. `callback` must not raise (wrap it in the session's guard)."""
    if name in sys.modules:
        callback(sys.modules[name])
        return
    sys.meta_path.insert(0, _AfterImport(name, callback))
