"""The spool of an attached run: the folder its processes write their events into, and sending
those events to the run's Redis stream (`ddpviz run` while the command runs; `ddpviz upload
SPOOL` afterwards, when Redis was away).

Files in a spool folder:

| file | written by | holds |
|---|---|---|
| ``events-rank{R}-pid{P}.jsonl`` | each instrumented process (`engine.attach.session`) | its events, one JSON per line |
| ``meta.json`` | `ddpviz run` at start | ``{run_id, command, label, host, created_at}`` |
| ``sent.json`` | the forwarder | bytes of each events file already stored in Redis, and whether `run_started` was |
| ``ending.json`` | `ddpviz run` at the end | ``{status, error, exit_code, ended_at}``, for `ddpviz upload` to record |
| ``error.json`` | torchrun (TORCHELASTIC_ERROR_FILE) | the failing rank's exception |
| ``error-rank{R}.json`` | each failing rank (`engine.attach.errors`) | its exception, with `time_ns`: the earliest is the run's |

Private by default: the folders are 0700 and the files 0600 (the command line may carry tokens);
the default folder is ``.ddpviz/spool/RUN_ID`` (``.ddpviz/`` holds a ``.gitignore`` of ``*``), or,
where the working directory cannot be written, the same under a per-user temporary folder
(`make_spool`). `ddpviz run` removes the run's folder once every event reached Redis
(`remove_spool`) and keeps it, saying where, when not.

Nothing is lost while Redis is away: what is not yet stored stays in the files, and `sent.json`
says where each file's unsent part begins. A chunk is stored whole or not at all
(`workers.sink.RedisStreamWriter`); a chunk whose reply was lost may be stored twice.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable

import redis

from ddpviz.engine.events import RawEvent, decode_json, make_event
from ddpviz.engine.summary import SummaryBuilder
from ddpviz.workers import keys
from ddpviz.workers.sink import WRITE_CHUNK, RedisStreamWriter
from ddpviz.workers.store import RunStore

RANK_FILE = re.compile(r"events-rank(?P<rank>\d+)-pid(?P<pid>\d+)\.jsonl")  # an instrumented process's file


def relaunch_note(pids: list[int]) -> str:
    """What a run says when rank 0 trained in more than one process of its command (`pids`, in order): a sweep
    driver's second `torchrun`, or torchrun restarting its workers. Each process counts its steps from 0, so the
    record holds steps of the same number from each (a new user's `ddpviz run -- python sweep.py`, two
    trainings under one run with steps 0-9 twice and nothing said, 2026-12-06)."""
    return (f"rank 0 trained in {len(pids)} processes of this command, one after another (pids "
            f"{', '.join(map(str, pids))}: a second launch, e.g. a sweep's next torchrun, or torchrun restarting its "
            "workers): each counts its steps from 0, so this run holds steps of the same number from each; run each "
            "training under its own `ddpviz run` to see them apart")


HOLD_FOR_STARTED_S = 60.0  # events wait at most this long for rank 0's run_started, so it is stored first


def _write_json(path: Path, obj: Any) -> None:
    """`obj` as JSON into `path` (0600), replaced whole (`engine.attach.errors.write_private`)."""
    from ddpviz.engine.attach.errors import write_private

    write_private(path, obj)


def _private_dir(path: Path) -> Path:
    """`path` created (missing parents get the default mode: make each level that must be private
    with this) and set 0700; one that exists must be this user's.

    Raises:
        OSError: it cannot be created or set, or another user owns it.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to another user")
    os.chmod(path, 0o700)
    return path


def user_temp_root() -> Path:
    """The per-user folder under the system's temporary folder: ``$TMPDIR/ddpviz-UID``."""
    return Path(tempfile.gettempdir()) / f"ddpviz-{os.getuid()}"


def make_spool(given: str | None, name: str, say: Callable[[str], None]) -> Path:
    """The run's spool folder, created 0700: `given` (``--spool``), else ``.ddpviz/spool/NAME`` in
    the working directory (``.ddpviz/.gitignore`` written with ``*``: git ignores the folder),
    else, where that cannot be written, ``user_temp_root()/spool/NAME`` (`say` tells where).

    Raises:
        OSError: no folder could be made.
    """
    if given:
        return _private_dir(Path(given).resolve())
    local = Path.cwd() / ".ddpviz"
    try:
        _private_dir(local)
        ignore = local / ".gitignore"
        if not ignore.exists():
            ignore.write_text("*\n")
        return _private_dir(_private_dir(local / "spool") / name)
    except OSError as exc:
        spool = _private_dir(_private_dir(_private_dir(user_temp_root()) / "spool") / name)
        say(f"cannot write {local} ({exc.strerror or exc}); the run's spool is {spool}")
        return spool


def remove_spool(spool: Path) -> None:
    """Remove the files of a spool folder (events, meta, sent, ending, error, rank exits; nothing else), then
    the folder if that left it empty."""
    for pattern in ("events-*.jsonl", "meta.json", "sent.json", "ending.json", "error.json", "error-rank*.json",
                    "rank-exits.json", "exit-rank*.json", "*.tmp", "open-rank*"):
        for path in spool.glob(pattern):
            try:
                path.unlink()
            except OSError:
                pass
    try:
        spool.rmdir()
    except OSError:
        pass


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class SpoolForwarder:
    """Reads the spool's event files and stores their events in the run's stream.

    Args:
        spool: the folder.
        run_id: the run.
        store: a `RunStore`, or None while Redis is unreachable (`connect` later).

    `pump()` reads what is new and sends it; `builder` has observed every event of every file
    (the run's summary), sent or not.
    """

    def __init__(self, spool: Path, run_id: str, store: RunStore | None = None):
        self.spool, self.run_id, self.store = Path(spool), run_id, store
        sent = read_json(self.spool / "sent.json") or {}
        self.sent: dict[str, int] = dict(sent.get("offsets", {}))
        self.started_sent = bool(sent.get("started_sent"))
        self.read_at: dict[str, int] = {}  # bytes of each file read so far
        self.pending: list[tuple[str, int, dict]] = []  # (file, end offset, event), in file order
        self.started: dict | None = None
        self.builder = SummaryBuilder()
        self.first_pending_at: float | None = None
        self.redis_error: BaseException | None = None
        self.rank0_pids: list[int] = []  # the processes rank 0's events came from, in the order their files appeared

    def connect(self, store: RunStore | None) -> None:
        self.store = store

    def _read(self) -> None:
        for path in sorted(self.spool.glob("events-*.jsonl")):
            name = path.name
            if name not in self.read_at:
                self._first_seen(name)
            pos = self.read_at.get(name, 0)  # the first byte not yet read as a whole line
            try:
                with open(path, "rb") as fh:
                    fh.seek(pos)
                    lines = fh.read().split(b"\n")[:-1]  # the last piece is an unfinished line (or empty)
            except OSError:
                continue
            for line in lines:
                pos += len(line) + 1
                if not line.strip():
                    continue
                event = RawEvent(decode_json(line), line)  # stored as this line: no second encoding
                self.builder.observe(event)
                if event.get("type") == "run_started":
                    self.started = event
                    if self.started_sent:
                        continue
                if pos > self.sent.get(name, 0):
                    self.pending.append((name, pos, event))
            self.read_at[name] = pos

    def _first_seen(self, name: str) -> None:
        """A new events file: when it is rank 0's of a second process (`relaunch_note`), a `log` warning goes
        out first (once per file, and not again where the file was being stored already)."""
        m = RANK_FILE.fullmatch(name)
        if m is None or m["rank"] != "0":
            return
        self.rank0_pids.append(int(m["pid"]))
        if len(self.rank0_pids) > 1 and self.sent.get(name, 0) == 0:
            note = make_event("log", self.run_id, rank=0, level="warning", message=relaunch_note(self.rank0_pids))
            self.builder.observe(note)
            self.pending.append((name, 0, note))

    def pump(self, final: bool = False, now: float | None = None) -> bool:
        """Read new events and store them. True when nothing is left to store."""
        import time

        self._read()
        now = time.monotonic() if now is None else now
        if self.pending and self.first_pending_at is None:
            self.first_pending_at = now
        if self.store is None:
            return not self.pending
        if not self.started_sent and self.started is None and not final and \
                now - (self.first_pending_at or now) < HOLD_FOR_STARTED_S:
            if not self._started_elsewhere():
                return not self.pending  # hold everything until rank 0's run_started is here
            self.started_sent = True  # another node's launcher stored it: nothing left to wait for
        try:
            self._send()
        except (redis.RedisError, OSError) as exc:
            self.redis_error = exc
            return False
        self.redis_error = None
        return not self.pending

    def _started_elsewhere(self) -> bool:
        """Whether the run's record already holds `run_started`: a `--join`ed node's spool never
        sees it when rank 0 runs on another node, whose launcher stores it. Before this check a
        joined node held its events for the whole HOLD_FOR_STARTED_S."""
        try:
            return bool(self.store.redis.hexists(keys.run(self.run_id), "started"))
        except (redis.RedisError, OSError):
            return False

    def _send(self) -> None:
        if self.started is not None and not self.started_sent:
            self._store_started(self.started)
            self.pending = [p for p in self.pending if p[2] is not self.started]
        writer = RedisStreamWriter(self.store.redis, self.run_id, self.store.stream_maxlen)
        while self.pending:
            chunk = self.pending[:WRITE_CHUNK]
            writer._write_chunk([e for _, _, e in chunk])
            del self.pending[:len(chunk)]
            for name, end, _ in chunk:
                self.sent[name] = max(self.sent.get(name, 0), end)
            self._save()

    def _store_started(self, event: dict) -> None:
        writer = RedisStreamWriter(self.store.redis, self.run_id, self.store.stream_maxlen)
        writer._write_chunk([event])
        self.store.save_started(self.run_id, event)
        rec = self.store.get(self.run_id) or {}
        config = {**(rec.get("config") or {}), **(event.get("config") or {})}
        fields = {"config": json.dumps(config)}
        if event.get("label") and not rec.get("label"):  # ddpviz.watch(name=...); `ddpviz run --name` wins
            fields["label"] = str(event["label"])
        self.store.redis.hset(keys.run(self.run_id), mapping=fields)
        self.started_sent = True
        self._save()

    def _save(self) -> None:
        _write_json(self.spool / "sent.json", {"offsets": self.sent, "started_sent": self.started_sent})

    def summary(self) -> dict[str, Any]:
        return self.builder.summary()
