"""One instrumented process of an attached run: who it is, where its events go, and the fail-open
guard every piece of instrumentation runs under.

Events go to this process's own JSONL file in the run's spool folder, written by a background
thread (`engine.events.rank_sink`); the launcher (`ddpviz run`) forwards the files to Redis. The
training process itself never touches the network, so a slow or lost Redis cannot slow or stop
it (the issue's fail-open rule).

Identity comes from torchrun's environment (torch.distributed.elastic sets RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE and GROUP_RANK, the node's index, for each worker); a process the
launcher started directly (``ddpviz run -- python train.py``) is rank 0 of 1.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from ddpviz.engine.attach.env import PUMP_INTERVAL_S, RUN_ID_ENV, SPOOL_ENV
from ddpviz.engine.events import make_event, rank_sink
from ddpviz.engine.measure.telemetry import Telemetry


class Session:
    """This process's part of an attached run.

    Attributes:
        rank, local_rank, world_size, node (torchrun's GROUP_RANK), local_world_size: from the env.
        tel: `Telemetry` writing this process's events (device set once a model is wrapped).
        disabled: names of instrumentation parts switched off after an error (`guard`).
        label: the run's name given to `ddpviz.watch()` (rank 0's is the run's), or None.
        tracker, started, memory: the process's `StepTracker`, `StartedEmitter`, `MemoryWatch`
            (set by `engine.attach.install`).
    """

    def __init__(self, env: dict[str, str] | None = None, sink=None):
        env = dict(os.environ if env is None else env)
        self.run_id = env[RUN_ID_ENV]
        self.spool = Path(env[SPOOL_ENV])
        self.rank = int(env.get("RANK", 0))
        self.local_rank = int(env.get("LOCAL_RANK", 0))
        self.world_size = int(env.get("WORLD_SIZE", 1))
        self.local_world_size = int(env.get("LOCAL_WORLD_SIZE", self.world_size))
        self.node = int(env.get("GROUP_RANK", 0))
        self.hostname = socket.gethostname()
        self.sink = sink if sink is not None else rank_sink(
            self.spool / f"events-rank{self.rank}-pid{os.getpid()}.jsonl", flush_interval_s=PUMP_INTERVAL_S)
        self.tel = Telemetry(self.sink, self.run_id, rank=self.rank, device=f"cpu:{self.rank}",
                             host=self.hostname)
        self.tracker = self.started = self.memory = None  # set by engine.attach.install
        self.label: str | None = None  # the run's name from ddpviz.watch(name=...), in run_started
        self.disabled: set[str] = set()
        self._noted: set[str] = set()
        self._lock = threading.Lock()

    def set_device(self, kind: str, index: int | None) -> None:
        """Name this rank's device in its events: ``cuda:I`` (the GPU it trains on) or ``cpu:RANK``."""
        self.tel.device = f"cuda:{index or 0}" if kind == "cuda" else f"cpu:{self.rank}"

    def emit(self, type_: str, **fields: Any) -> None:
        self.tel.emit(type_, **fields)

    def guard(self, part: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)`, unless `part` is off. The first exception switches `part` off,
        is reported once (a line on stderr and a `log` event) and is not raised: training goes on.
        Returns fn's result, or None when off or failed."""
        if part in self.disabled:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            self.disable(part, exc)
            return None

    def note(self, message: str, level: str = "warning") -> None:
        """Say `message` once in this process: a line on stderr and a `log` event."""
        with self._lock:
            if message in self._noted:
                return
            self._noted.add(message)
        print(f"ddpviz: {message}", file=sys.stderr, flush=True)
        try:
            self.emit("log", level=level, message=message)
        except Exception:
            pass

    def disable(self, part: str, exc: BaseException) -> None:
        """Switch `part` off and say so once."""
        with self._lock:
            if part in self.disabled:
                return
            self.disabled.add(part)
        message = (f"ddpviz: rank {self.rank}: {part} instrumentation off after an error "
                   f"({type(exc).__name__}: {exc}); training goes on")
        print(message, file=sys.stderr, flush=True)
        try:
            self.sink.emit(make_event("log", self.run_id, rank=self.rank, device=self.tel.device,
                                      host=self.hostname, level="warning", message=message))
        except Exception:
            pass

    def close(self) -> None:
        try:
            self.sink.close()
        except Exception:
            pass


class DeferredMarks:
    """A watch whose CUDA marks of a step are read at a later step's end, once `Event.query()`
    says they completed (never a synchronize during training). A subclass keeps `deferred` (oldest
    first), sets `DEFERRED_PART` (its guard's part name) and defines `_item_marks(item)` and
    `_emit_completed()` (emit and drop the leading items whose marks completed).

    `drain`, at exit (`engine.attach.steps.StepTracker.close`): the last steps' items, which no
    later step will read, once their marks completed (`engine.measure.clocks.wait_marks`: a wait
    per pending event, after the script's last step)."""

    DEFERRED_PART = ""
    s: Session
    deferred: list

    def _item_marks(self, item: Any) -> Any:
        raise NotImplementedError

    def _emit_completed(self) -> None:
        raise NotImplementedError

    def drain(self) -> None:
        if self.deferred and self.DEFERRED_PART not in self.s.disabled:
            self.s.guard(self.DEFERRED_PART, self._drain)

    def _drain(self) -> None:
        from ddpviz.engine.measure.clocks import wait_marks

        for item in self.deferred:
            wait_marks(self._item_marks(item))
        self._emit_completed()
