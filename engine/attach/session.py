"""One instrumented process of an attached run: who it is, where its events go, and the fail-open
guard every piece of instrumentation runs under.

Events go to this process's own JSONL file in the run's spool folder, written by a background
thread (`engine.batching.rank_sink`); the launcher (`ddpviz run`) forwards the files to Redis. The
training process itself never touches the network, so a slow or lost Redis cannot slow or stop
it (the issue's fail-open rule).

Identity comes from torchrun's environment (torch.distributed.elastic sets RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE and GROUP_RANK, the node's index, for each worker); without RANK
(Lightning's rank 0, a `torch.multiprocessing.spawn` worker) from the default process group once it
is initialised, else rank 0 of 1.

The event file is created at the first event (`_LazySink`): a process that is instrumented but
never trains (`accelerate launch` itself, the parent of `torch.multiprocessing.spawn`) writes
nothing, and the launcher can tell a run in which no process trained. Spool files are 0600.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from ddpviz.engine.attach.env import PUMP_INTERVAL_S, RUN_ID_ENV, SPOOL_ENV, bucket_timing
from ddpviz.engine.events import emit_all, make_event
from ddpviz.engine.batching import rank_sink
from ddpviz.engine.measure.telemetry import Telemetry

OPEN_MARKER = "open-rank{rank}-pid{pid}"  # in the spool while a rank's record is open (`Session._open_sink`)


class Session:
    """This process's part of an attached run.

    Attributes:
        rank, local_rank, world_size, node (torchrun's GROUP_RANK), local_world_size: from the env.
        tel: `Telemetry` writing this process's events (device set once a model is wrapped).
        disabled: names of instrumentation parts switched off after an error (`guard`).
        label: the run's name given to `ddpviz.watch()` (rank 0's is the run's), or None.
        bucket_timing: "auto", "hook" or "recorder" (`ddpviz run --bucket-timing`, `engine.attach.env`; "auto" per
            DDP: `engine.attach.nohook.bucket_timing_of`).
        tracker, started, memory: the process's `StepTracker`, `StartedEmitter`, `MemoryWatch`
            (set by `engine.attach.install`).
    """

    def __init__(self, env: dict[str, str] | None = None, sink=None):
        env = dict(os.environ if env is None else env)
        self.run_id = env[RUN_ID_ENV]
        self.spool = Path(env[SPOOL_ENV])
        self.spool.mkdir(mode=0o700, parents=True, exist_ok=True)  # raises OSError: the caller fails open
        if not os.access(self.spool, os.W_OK | os.X_OK):
            raise PermissionError(f"cannot write into the spool folder {self.spool}")
        self._from_env = bool(env.get("RANK"))  # else from the process group, once there is one
        self._rank = int(env.get("RANK", 0))
        self.local_rank = int(env.get("LOCAL_RANK", 0))
        self._world_size = int(env.get("WORLD_SIZE", 1))
        self._local_world_size = int(env["LOCAL_WORLD_SIZE"]) if env.get("LOCAL_WORLD_SIZE") else None
        self.node = int(env.get("GROUP_RANK", env.get("NODE_RANK", 0)))
        self.bucket_timing = bucket_timing(env)
        self.hostname = socket.gethostname()
        self.sink = sink if sink is not None else _LazySink(self._open_sink)
        self.tel = Telemetry(self.sink, self.run_id, rank=self._rank, device=f"cpu:{self._rank}",
                             host=self.hostname)
        self.tracker = self.started = self.memory = None  # set by engine.attach.install
        self.label: str | None = None  # the run's name from ddpviz.watch(name=...), in run_started
        self.disabled: set[str] = set()
        self._noted: set[str] = set()
        self._lock = threading.Lock()

    def _identity(self) -> None:
        """Take rank and world size from the default process group, once: a process without
        torchrun's RANK whose group is up."""
        if self._from_env:
            return
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            self._rank, self._world_size = dist.get_rank(), dist.get_world_size()
            self._from_env = True
            self.tel.rank = self._rank
            if self.tel.device == "cpu:0":
                self.tel.device = f"cpu:{self._rank}"

    @property
    def rank(self) -> int:
        self._identity()
        return self._rank

    @property
    def trained(self) -> bool:
        """Whether this process wrote an event (a process that only launched others did not)."""
        return getattr(self.sink, "_sink", True) is not None

    @property
    def world_size(self) -> int:
        self._identity()
        return self._world_size

    @property
    def local_world_size(self) -> int:
        return self._local_world_size or self.world_size

    def _open_sink(self):
        """This process's event file, created 0600 (it may name the script's arguments), and its open
        marker (`OPEN_MARKER`), removed by `close`: one left behind tells `ddpviz run` that the process
        ended without closing its record (`os._exit`, a kill), so its last events may be missing."""
        path = self.spool / f"events-rank{self.rank}-pid{os.getpid()}.jsonl"
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        self._marker = self.spool / OPEN_MARKER.format(rank=self.rank, pid=os.getpid())
        os.close(os.open(self._marker, os.O_WRONLY | os.O_CREAT, 0o600))
        return rank_sink(path, flush_interval_s=PUMP_INTERVAL_S)

    def set_device(self, kind: str, index: int | None) -> None:
        """Name this rank's device in its events: ``cuda:I`` (the GPU it trains on) or ``cpu:RANK``."""
        self.tel.device = f"cuda:{index or 0}" if kind == "cuda" else f"cpu:{self.rank}"

    def emit(self, type_: str, **fields: Any) -> None:
        """One event, built on the writer thread (`Telemetry.emit_soon`): the script's thread pays an append."""
        self._identity()
        self.tel.emit_soon(type_, [fields])

    def emit_many(self, type_: str, rows: list[dict[str, Any]], **common: Any) -> None:
        """`emit` for each row (`Telemetry.emit_soon`); `rows` are handed over (not changed after)."""
        self._identity()
        self.tel.emit_soon(type_, rows, **common)

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
        marker = getattr(self, "_marker", None)
        if marker is not None:  # every event is written: the record is closed
            try:
                marker.unlink()
            except OSError:
                pass


class _LazySink:
    """A sink that opens the real one (`open_sink()`) at its first event."""

    def __init__(self, open_sink: Callable[[], Any]):
        self._open, self._sink = open_sink, None

    def emit(self, event: dict) -> None:
        if self._sink is None:
            self._sink = self._open()
        self._sink.emit(event)

    def emit_many(self, events: list[dict]) -> None:
        if self._sink is None:
            self._sink = self._open()
        emit_all(self._sink, events)

    def emit_later(self, later: Any) -> None:
        """The real sink's `emit_later` (`_open_sink` makes a `rank_sink`, a `BatchingSink`, which has it)."""
        if self._sink is None:
            self._sink = self._open()
        self._sink.emit_later(later)

    def flush(self) -> None:
        if self._sink is not None and hasattr(self._sink, "flush"):
            self._sink.flush()

    def close(self) -> None:
        if self._sink is not None:
            self._sink.close()


def _inert(*args: Any, **kwargs: Any) -> None:
    return None


class Detached:
    """What a pickled or deep-copied module keeps of ddpviz: hooks that do nothing (any attribute is a
    no-op function), not watched. `PickledAsDetached` makes ddpviz's objects pickle as this."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("__"):
            raise AttributeError(name)
        return _inert

    def __reduce__(self) -> tuple:
        return Detached, ()


class PickledAsDetached:
    """A ddpviz object that the script's modules reach (its forward hooks are this object's methods; a DDP's
    `_ddpviz_watch` and comm hook state) pickles and deep-copies as a `Detached`: a script that saves its model
    or DDP whole (`torch.save(ddp)`, `pickle.dumps`, `copy.deepcopy`) does as without ddpviz. Before
    2026-12-06 the pickle reached the session's open event file ("cannot pickle '_io.FileIO' object")."""

    def __reduce__(self) -> tuple:
        return Detached, ()


class DeferredMarks(PickledAsDetached):
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
