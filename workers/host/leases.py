"""Per-host device leases in Redis: two runs on one host never share a GPU.

Before a run that will use CUDA starts, its job leases as many of this host's GPUs as the run
needs (`gpus_needed`), all at once or none, and hands the run exactly those
(``CUDA_VISIBLE_DEVICES`` = their UUIDs, so the run sees them as ``cuda:0..n-1``). A lease is the
key ``ddpviz:lease:{host}:{gpu uuid}`` holding the run id; it expires `LEASE_TTL_S` seconds after
its last refresh, so the GPUs of a run whose worker was killed come free by themselves. A run
that finds too few free GPUs waits (and says so in a ``log`` event) until enough are released,
it is canceled, or its time limit passes. CPU runs need no lease: on CPU, concurrent runs share
the cores (each DDP run still gets its own rendezvous port).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import redis

from ddpviz.workers import keys

log = logging.getLogger("ddpviz.worker")

LEASE_TTL_S = 30.0  # a lease not refreshed for this long frees its GPU
LEASE_REFRESH_S = 5.0  # between refreshes by the run holding it
LEASE_POLL_S = 0.5  # between tries while waiting for free GPUs


def gpus_needed(cfg: Any, gpus_visible: int) -> int:
    """GPUs this host's part of `cfg` will use: 0 on CPU. Mirrors `engine.components.devices.resolve_plan`
    (``device=auto`` takes CUDA when the host has enough GPUs)."""
    local = 1 if cfg.mode == "single" else cfg.world_size // cfg.nnodes
    if cfg.device == "cpu" or (cfg.device == "auto" and gpus_visible < local):
        return 0
    return local


class DeviceLease:
    """GPUs of one host leased to one run.

    Args:
        connection: Redis client (bytes replies).
        host: this host's name (leases are per host).
        run_id: the run holding the lease (the keys' value).
    """

    def __init__(self, connection: redis.Redis, host: str, run_id: str,
                 ttl_s: float = LEASE_TTL_S, refresh_s: float = LEASE_REFRESH_S):
        self.connection, self.host, self.run_id = connection, host, run_id
        self.ttl_ms, self.refresh_s = int(ttl_s * 1000), refresh_s
        self.held: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def try_acquire(self, devices: list[str], n: int) -> list[str] | None:
        """Lease `n` of `devices` (in their order) if that many are free now; else None."""
        names = [keys.device_lease(self.host, d) for d in devices]
        with self.connection.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(*names)
                    holders = pipe.mget(names)
                    free = [d for d, h in zip(devices, holders) if h is None]
                    if len(free) < n:
                        pipe.unwatch()
                        return None
                    pipe.multi()
                    for d in free[:n]:
                        pipe.set(keys.device_lease(self.host, d), self.run_id, px=self.ttl_ms)
                    pipe.execute()
                    self.held = free[:n]
                    return list(self.held)
                except redis.WatchError:
                    continue  # another run took or freed one meanwhile: look again

    def acquire(self, devices: list[str], n: int, should_stop: Callable[[], bool],
                on_wait: Callable[[list[str]], None] | None = None,
                poll_s: float = LEASE_POLL_S) -> list[str] | None:
        """Wait until `n` of `devices` are leased to this run, then keep them fresh from a daemon
        thread. Returns them, or None if `should_stop()` turned True first.

        Args:
            on_wait: called once, with the runs holding the devices, if the run has to wait.
        """
        waited = False
        while True:
            got = self.try_acquire(devices, n)
            if got is not None:
                self._start_refreshing()
                return got
            if not waited and on_wait is not None:
                on_wait(self.holders(devices))
            waited = True
            if should_stop():
                return None
            time.sleep(poll_s)

    def holders(self, devices: list[str]) -> list[str]:
        """Run ids holding any of `devices` now."""
        raw = self.connection.mget([keys.device_lease(self.host, d) for d in devices])
        return sorted({h.decode() for h in raw if h})

    def _refresh(self) -> None:
        for d in self.held:
            try:
                if not self._if_ours(d, lambda pipe, key: pipe.pexpire(key, self.ttl_ms)):
                    log.warning("run %s: lost its lease of GPU %s", self.run_id, d)
            except redis.WatchError:
                pass

    def _if_ours(self, device: str, action) -> bool:
        """Run `action(pipe, key)` on device's lease in one transaction if this run still holds it
        (WATCH, GET, MULTI, EXEC: redis.io/docs/latest/develop/interact/transactions). Returns
        whether it did. Raises redis.WatchError when another client wrote the key meanwhile."""
        key = keys.device_lease(self.host, device)
        with self.connection.pipeline(transaction=True) as pipe:
            pipe.watch(key)
            if pipe.get(key) != self.run_id.encode():
                pipe.unwatch()
                return False
            pipe.multi()
            action(pipe, key)
            pipe.execute()
            return True

    def _loop(self) -> None:
        while not self._stop.wait(self.refresh_s):
            try:
                self._refresh()
            except (redis.RedisError, OSError) as exc:  # a Redis blip: the TTL covers several tries
                log.warning("run %s: cannot refresh GPU leases: %s", self.run_id, exc)

    def _start_refreshing(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="ddpviz-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Free every device this run holds (only keys still holding this run's id)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.refresh_s + 1)
        for d in self.held:
            try:
                self._if_ours(d, lambda pipe, key: pipe.delete(key))
            except (redis.WatchError, redis.RedisError) as exc:
                log.warning("run %s: could not free GPU %s (%s); its lease expires", self.run_id, d, exc)
        self.held = []
