"""Turn-taking between training jobs, so their step times are measured side by side in time.

The overhead measurement (`engine.harness.overhead`) runs plain torch DDP and ddpviz's DDP at the same
time, in their own processes, but never both at once: each side trains in blocks of `block_steps`
steps and waits, blocked on a socket read (no CPU used), while the other side trains its block.
The predictor's validation does the same with every run it compares (DP and DDP at several world
sizes, and the single baseline), so calibration and check see the same machine.
On this 2-core VM the step time of the same loop drifts by 30-60% over seconds (per 250-step
window of one plain run: 3.7-6.5 ms), far more than the few percent being measured, so sides
compared minutes apart (one whole run after another) measure the machine's drift; blocks a
fraction of a second apart see the same machine.

Protocol (`multiprocessing.connection`, HMAC authkey, over 127.0.0.1): each rank connects and
says ``(side, rank)``; at every step s with ``s % block_steps == 0`` it says ``"done"`` (for
s > 0) and waits for ``"go"``; after its last step it calls `at_end`, which does the same. The
`TurnController` releases one side's ranks per block, in the order it is given, and waits for all
of them to say done. When it stops (finished or failed) it closes every connection: a rank waiting
for its turn then gets EOFError and fails, so nothing waits forever.

The gate is active only in processes whose environment holds `GATE_ENV` (set by the overhead
harness); every other run gets `None` from `gate_from_env` and pays one `is None` test per step.
A ddpviz run's side is its run_id (`engine.components.loop.drive`); the plain loop's is "plain".
"""

from __future__ import annotations

import os
import queue
import secrets
import threading
import time
from multiprocessing.connection import Client, Connection, Listener, wait
from typing import Callable

GATE_ENV = "DDPVIZ_TURN_GATE"  # "host:port:authkey hex:block_steps"
PAIR_TURN_STEPS = 10  # steps per turn of an app pair when they divide its steps into >= 2 turns
PAIR_TURN_RANGE = (2, 20)  # else the largest steps per turn in this range that does (steps)


def pair_turn_steps(steps: int) -> tuple[int | None, str]:
    """Steps per turn for a DP+DDP pair of `steps` steps each, and the sentence that says so.

    `PAIR_TURN_STEPS` (10) when it divides `steps` into two turns or more, else the largest
    divisor of `steps` in `PAIR_TURN_RANGE` (2..20) that does, else None: the pair then runs one
    after the other, and the sentence says why (a turn must be whole steps, the gate sits between
    steps, and one turn each would be one run after the other anyway).

    Examples: 20 -> 10, 100 -> 10, 12 -> 6, 10 -> 5, 4 -> 2, 7 -> None, 5 -> None.

    Raises:
        ValueError: `steps` is not an integer >= 1 (the message names ``steps``).
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1 (got {steps!r})")
    lo, hi = PAIR_TURN_RANGE
    candidates = [PAIR_TURN_STEPS] + list(range(hi, lo - 1, -1))
    for block in candidates:
        if steps % block == 0 and steps // block >= 2:
            return block, f"in turns of {block} steps ({steps // block} turns each)"
    nearest = max(2, -(-steps // PAIR_TURN_STEPS)) * PAIR_TURN_STEPS  # the next multiple giving two turns
    return None, (f"no turn of {lo}-{hi} steps divides steps={steps} into two turns or more "
                  f"(use a multiple of {PAIR_TURN_STEPS}, e.g. {nearest}, to have DP and DDP take turns)")


class TurnGate:
    """One rank's side of the protocol.

    Args:
        spec: the `GATE_ENV` value.
        side: the side's name (a ddpviz run's run_id, or "plain").
        rank: this rank.

    Raises:
        ValueError: `spec` is not "host:port:key:block_steps" with block_steps >= 2.
        EOFError: (from `at_step`/`at_end`) the controller stopped.
    """

    def __init__(self, spec: str, side: str, rank: int):
        try:
            host, port, key, block = spec.split(":")
            self.block_steps = int(block)
            address = (host, int(port))
            authkey = bytes.fromhex(key)
        except ValueError as exc:
            raise ValueError(f"{GATE_ENV} must be 'host:port:key:block_steps' (got {spec!r})") from exc
        if self.block_steps < 2:
            raise ValueError(f"{GATE_ENV}: block_steps must be >= 2 (got {self.block_steps})")
        self.conn: Connection = Client(address, authkey=authkey)
        self.conn.send((side, rank))

    def at_step(self, step: int) -> None:
        """Call before each step: at a block boundary, report the block done and wait for a turn."""
        if step % self.block_steps == 0:
            if step > 0:
                settle_gpu()
                self.conn.send("done")
            self._wait_go()

    def at_end(self) -> None:
        """Call after the last step: report the last block done and wait to be released."""
        settle_gpu()
        self.conn.send("done")
        self._wait_go()
        self.conn.close()

    def close(self) -> None:
        """Leave the turns early (the run ended): the controller sees EOF and stops waiting for us."""
        self.conn.close()

    def _wait_go(self) -> None:
        msg = self.conn.recv()
        if msg != "go":
            raise RuntimeError(f"turn gate: expected 'go' from the controller, got {msg!r}")


def settle_gpu() -> None:
    """Wait for this process's queued CUDA work (nothing where torch never initialised CUDA): a block is
    done when its GPU work is, so none of it runs, and is timed, in the other side's turn. A loop that
    never synchronises (plain DDP, ddpviz's late-read steps) can be steps ahead of the GPU on the host."""
    torch = loaded_torch()
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def loaded_torch():
    """torch if this process imported it, else None (the gate never imports torch itself)."""
    import sys

    return sys.modules.get("torch")


def gate_from_env(side: str, rank: int) -> TurnGate | None:
    """A `TurnGate` when `GATE_ENV` is set in this process's environment, else None."""
    spec = os.environ.get(GATE_ENV)
    return TurnGate(spec, side, rank) if spec else None


class TurnController:
    """Hands out turns to the ranks of several sides.

    Args:
        sides: side name -> how many ranks it has (each connects once).
        block_steps: steps per block (each side's `cfg.steps` must be a multiple of it).
        timeout_s: most seconds to wait for all ranks to connect, or for one block to finish.

    Use `spec` as the `GATE_ENV` value for every side's processes, then call `run(order, alive)`
    (all or nothing) or `run(order, side_alive=...)` (a side that ends is dropped).
    """

    def __init__(self, sides: dict[str, int], block_steps: int, timeout_s: float = 300.0):
        self.sides, self.block_steps, self.timeout_s = dict(sides), block_steps, timeout_s
        self._key = secrets.token_bytes(16)
        self._closed = False
        self._listener = Listener(("127.0.0.1", 0), authkey=self._key)
        self._accepted: queue.Queue = queue.Queue()
        self._conns: dict[str, dict[int, Connection]] = {s: {} for s in self.sides}
        self.block_log: list[tuple[str, float, float]] = []  # (side, released at, done at), unix s
        self.dropped: dict[str, str] = {}  # side -> why it left the turns early (side_alive mode)
        threading.Thread(target=self._accept_loop, name="ddpviz-turns-accept", daemon=True).start()

    @property
    def spec(self) -> str:
        host, port = self._listener.address
        return f"{host}:{port}:{self._key.hex()}:{self.block_steps}"

    def _accept_loop(self) -> None:
        while True:
            try:
                conn = self._listener.accept()
            except Exception:  # listener closed (`close`), or a client failed the authkey check
                if self._closed:
                    return
                continue
            self._accepted.put(conn)

    def _connected(self) -> int:
        return sum(len(c) for s, c in self._conns.items() if s not in self.dropped)

    def _expected(self) -> int:
        return sum(n for s, n in self.sides.items() if s not in self.dropped)

    def _drop(self, side: str, why: str) -> None:
        """Take `side` out of the turns (side_alive mode) and close its connections."""
        self.dropped.setdefault(side, why)
        for c in self._conns[side].values():
            c.close()

    def _check_alive(self, alive, side_alive, where: str) -> None:
        if side_alive is None:
            if not alive():
                raise RuntimeError(f"a side ended {where}")
            return
        for side in self.sides:
            if side not in self.dropped and not side_alive(side):
                self._drop(side, f"ended {where}")

    def _connect_all(self, alive, side_alive) -> None:
        deadline = time.monotonic() + self.timeout_s
        while self._connected() < self._expected():
            self._check_alive(alive, side_alive, "before all its ranks reached the turn gate")
            if time.monotonic() > deadline:
                raise TimeoutError(f"not every rank reached the turn gate within {self.timeout_s:.0f} s")
            try:
                conn = self._accepted.get(timeout=0.2)
            except queue.Empty:
                continue
            side, rank = conn.recv()
            if side not in self._conns or rank in self._conns[side] or not 0 <= rank < self.sides[side]:
                raise RuntimeError(f"turn gate: unexpected rank {(side, rank)}")
            self._conns[side][rank] = conn
            if side in self.dropped:
                conn.close()

    def run(self, order: list[str], alive: Callable[[], bool] | None = None, *,
            side_alive: Callable[[str], bool] | None = None) -> None:
        """Release the sides' blocks in `order` (one entry per block), then release everyone.

        Args:
            alive: returns False once any side has ended early (its processes or thread): the
                turns stop with RuntimeError (all or nothing: a harness's measurement is void).
            side_alive: instead of `alive`: side -> whether it still runs. A side that ended, or
                whose rank closed its connection or broke the protocol, is dropped (`dropped`
                says why) and the others go on taking turns without it.

        Raises:
            RuntimeError: (without `side_alive`) a rank said something other than "done", or a
                side ended early.
            TimeoutError: ranks did not connect, or a block did not finish, within `timeout_s`.
        """
        if (alive is None) == (side_alive is None):
            raise ValueError("give exactly one of alive and side_alive")
        try:
            self._connect_all(alive, side_alive)
            for side in order:
                if side in self.dropped:
                    continue
                self._check_alive(alive, side_alive, "before its turn")
                if side not in self.dropped:
                    self._one_block(side, alive, side_alive)
            for side, conns in self._conns.items():  # every block done: let the sides finish
                for c in conns.values():
                    if side not in self.dropped:
                        self._send_go(side, c, side_alive)
        finally:
            self.close()

    def _send_go(self, side: str, conn: Connection, side_alive) -> bool:
        try:
            conn.send("go")
            return True
        except OSError:
            if side_alive is None:
                raise
            self._drop(side, "closed its connection")
            return False

    def _one_block(self, side: str, alive, side_alive) -> None:
        conns = list(self._conns[side].values())
        released = time.time()
        for c in conns:
            if not self._send_go(side, c, side_alive):
                return
        pending, deadline = set(conns), time.monotonic() + self.timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"a {side} block did not finish within {self.timeout_s:.0f} s")
            for c in wait(list(pending), timeout=1.0):
                try:
                    msg = c.recv()
                except (EOFError, OSError):
                    msg = None
                if msg != "done":
                    if side_alive is None:
                        raise RuntimeError(f"turn gate: expected 'done' from {side}, got {msg!r}")
                    self._drop(side, "ended in the middle of its turn")
                    return
                pending.discard(c)
            if pending and side_alive is None and not alive():
                raise RuntimeError(f"the {side} side ended in the middle of a block")
            if pending and side_alive is not None and not side_alive(side):
                self._drop(side, "ended in the middle of its turn")
                return
        self.block_log.append((side, released, time.time()))

    def close(self) -> None:
        """Close the listener and every connection (a waiting rank gets EOFError)."""
        self._closed = True
        self._listener.close()
        for conns in self._conns.values():
            for c in conns.values():
                c.close()
