"""Worker heartbeats: who is serving the queue, on what devices, doing which run.

Each worker keeps a hash ``ddpviz:worker:{name}`` (fields: name, host, pid, devices (JSON),
gpus (JSON: live NVML figures per GPU, see `workers.host.gpus.GpuMonitor.stats`), ts (unix seconds of
the last beat), current_run (a run id, or ``"dp,ddp"`` while a pair trains in turns,
`workers.jobs.pair`), state) that expires `HEARTBEAT_TTL_S` seconds
after its last refresh, and adds its name to the set ``ddpviz:workers``. Readers drop names whose
hash has expired, so a worker killed with SIGKILL disappears within `HEARTBEAT_TTL_S`, and the
run it was running is marked lost (`workers.liveness`, whose monitor runs in this thread).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Any, Callable

import redis

from ddpviz.workers import keys

log = logging.getLogger("ddpviz.worker")

HEARTBEAT_INTERVAL_S = 3.0  # between refreshes
HEARTBEAT_TTL_S = 15  # the hash expires this long after the last refresh (several missed beats)
# What a page or the CLI says of a queued run while no worker is alive (none sent a heartbeat within the TTL): a
# new user's `submit --wait` sat silent with none (2026-12-06); one home for the sentence
NO_WORKER = (f"no worker is serving the queue (none sent a heartbeat in the last {HEARTBEAT_TTL_S} s): queued runs "
             "wait until one starts (`ddpviz worker` on a host, or `ddpviz up`)")


def detect_devices() -> list[dict[str, Any]]:
    """Devices of this host without importing torch (the worker process must stay CUDA-free so
    its forked work-horses can use CUDA): the CPU, plus GPUs NVML reports.

    Returns:
        ``[{name, kind, total_memory_bytes, ...}]``; kind is ``cpu`` or ``cuda``.
    """
    try:
        mem_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        mem_bytes = None
    devices: list[dict[str, Any]] = [{"name": "cpu", "kind": "cpu", "cores": os.cpu_count(),
                                      "total_memory_bytes": mem_bytes}]
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(handle)
                devices.append({"name": name.decode() if isinstance(name, bytes) else name,
                                "kind": "cuda", "index": i,
                                "total_memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)})
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML library or no driver: CPU only
        pass
    return devices


def set_current_run(connection: redis.Redis, worker_name: str, run_id: str | None) -> None:
    """Record which run a worker is on now (the next beat confirms it). Errors are logged."""
    try:
        pipe = connection.pipeline(transaction=True)
        pipe.hset(keys.worker(worker_name), "current_run", run_id or "")
        pipe.expire(keys.worker(worker_name), HEARTBEAT_TTL_S)  # never leave a hash without TTL
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("worker %s: cannot record current run: %s", worker_name, exc)


def read_workers(connection: redis.Redis) -> list[dict[str, Any]]:
    """Live workers, sorted by name: ``{name, host, pid, devices, gpus, ts, current_run, state}``
    (gpus: ``[{index, name, memory_used_bytes, memory_total_bytes, utilization_pct}]``, empty
    without GPUs). Names whose heartbeat expired are removed from the set."""
    names = sorted(n.decode() for n in connection.smembers(keys.WORKERS))
    if not names:
        return []
    pipe = connection.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(keys.worker(name))
    out, dead = [], []
    for name, h in zip(names, pipe.execute()):
        if not h or b"ts" not in h:
            dead.append(name)
            continue
        text = {k.decode(): v.decode() for k, v in h.items()}
        out.append({"name": name, "host": text.get("host"), "pid": int(text.get("pid") or 0),
                    "devices": json.loads(text.get("devices") or "[]"),
                    "gpus": json.loads(text.get("gpus") or "[]"), "ts": float(text["ts"]),
                    "current_run": text.get("current_run") or None, "state": text.get("state")})
    if dead:
        connection.srem(keys.WORKERS, *dead)
    return out


class Heartbeat:
    """Refreshes a worker's heartbeat hash every `interval_s` seconds from a daemon thread
    (`start`), or once per `beat()` call for a caller with its own loop.

    Args:
        connection: a client used only by this thread.
        name: the worker's name.
        current: returns ``(current_run_id or None, state)`` at each beat.
        devices: from `detect_devices()`.
        gpus: a `workers.host.gpus.GpuMonitor` whose live figures go into every beat (None: none).
        monitor: called after each beat in this thread (`LostRunMonitor.maybe_sweep`).
        in_worker_set: add `name` to ``ddpviz:workers`` (the queue's workers). False for a
            `ddpviz run` launcher (`keys.attach_launcher`): it serves no queue, but its run is
            judged lost by the same rule when its hash expires (`workers.liveness`).
    """

    def __init__(self, connection: redis.Redis, name: str,
                 current: Callable[[], tuple[str | None, str]], devices: list[dict[str, Any]],
                 interval_s: float = HEARTBEAT_INTERVAL_S, ttl_s: int = HEARTBEAT_TTL_S,
                 gpus: Any = None, monitor: Callable[[], Any] | None = None, in_worker_set: bool = True):
        self.connection, self.name, self.current = connection, name, current
        self.gpus, self.monitor, self.in_worker_set = gpus, monitor, in_worker_set
        self.interval_s, self.ttl_s = interval_s, ttl_s
        self.static = {"name": name, "host": socket.gethostname(), "pid": str(os.getpid()),
                       "devices": json.dumps(devices)}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ddpviz-heartbeat", daemon=True)

    def beat(self) -> None:
        """Write one heartbeat (raises redis.RedisError)."""
        run_id, state = self.current()
        key = keys.worker(self.name)
        pipe = self.connection.pipeline(transaction=True)
        gpus = json.dumps(self.gpus.stats() if self.gpus is not None else [])
        pipe.hset(key, mapping={**self.static, "ts": repr(time.time()), "gpus": gpus,
                                "current_run": run_id or "", "state": state})
        pipe.expire(key, self.ttl_s)
        if self.in_worker_set:
            pipe.sadd(keys.WORKERS, self.name)
        pipe.execute()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except Exception as exc:  # keep beating through Redis blips
                log.warning("worker %s: heartbeat failed: %s", self.name, exc)
                continue
            if self.monitor is not None:
                try:
                    self.monitor()
                except Exception as exc:
                    log.warning("worker %s: lost-run check failed: %s", self.name, exc)

    def start(self) -> "Heartbeat":
        self.beat()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop beating and remove this worker's heartbeat."""
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 5)
        if self.gpus is not None:
            self.gpus.close()
        try:
            pipe = self.connection.pipeline(transaction=True)
            pipe.delete(keys.worker(self.name))
            pipe.srem(keys.WORKERS, self.name)
            pipe.execute()
        except redis.RedisError:
            pass  # it expires anyway
