"""TCP ports for the processes a run starts (rendezvous stores, embedded Redis servers). No torch.

`free_port` picks at random below the kernel's ephemeral range rather than asking the kernel for
one (bind to port 0): the kernel hands out ports of that range to every outgoing connection too,
so a port it picked and released can be taken by any `connect()` on the machine before its
caller binds it. Seen 2026-12-04 in a loaded test run: a two-rank reference's TCPStore failed
with EADDRINUSE on the port `bind(0)` had just returned. Below the range, only another explicit
chooser can take it, and each tries the bind first.
"""

from __future__ import annotations

import secrets
import socket

EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"  # Linux: "32768\t60999" by default
POOL_SIZE = 12000  # ports below the ephemeral range to draw from
TRIES = 50


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default where it cannot be read)."""
    try:
        with open(EPHEMERAL_RANGE_FILE, encoding="ascii") as fh:
            low, high = (int(v) for v in fh.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now on `host`: one of the `POOL_SIZE` ports below the
    kernel's ephemeral range, at random (`secrets`, so forked processes do not draw alike), that
    binds; after `TRIES` taken ones, or where the range leaves no room below it (starts under
    11,024), the kernel's pick (bind to port 0)."""
    low = ephemeral_range()[0]
    first = max(1024, low - POOL_SIZE)
    if low - first >= 1000:
        for _ in range(TRIES):
            port = first + secrets.randbelow(low - first)
            if _bindable(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
