"""Fault injection: make one rank (DDP) or device thread (DP) fail at a chosen step.

A teaching feature and the driver of the reliability tests: `raise` throws, `kill` SIGKILLs the
process (in DP that is the whole run: one process), `hang` sleeps until the collective timeout of
the other ranks ends the run (DDP only), `diverge` nudges one replica's weights: in DDP after its
optimizer step, and DDP's replica check then fails the run; in DP right after the step's broadcast,
so that replica computes the step's gradient with drifted weights and is thrown away with the
step's replicas (DP rebuilds them from device 0 every step; engine/modes/dp/emulated.py).
"""

from __future__ import annotations

import os
import signal
import time

from ddpviz.engine.config import RunConfig
from ddpviz.engine.stages import unit_word

HANG_S = 3600.0  # long enough that only the collective timeout (or a cancel) ends it


class InjectedFault(RuntimeError):
    """The failure asked for with `fault=raise`; `.rank` is the rank or device that raised."""

    def __init__(self, message: str, rank: int):
        self.rank = rank
        super().__init__(message)


DIVERGE_NUDGE = 1e-3  # added to every weight of the diverging replica


def diverge_note(cfg: RunConfig) -> str:
    """What `fault=diverge` did in `cfg`'s mode, in words, for the run's record (a `log` event when it is injected,
    and DDP's replica-check failure): a DP run that succeeds after it, or a DDP run failing at a later check step
    on another rank, must not leave a user guessing whether the fault happened (a new user, 2026-12-06)."""
    unit, n, at = unit_word(cfg.mode), cfg.fault_rank, cfg.fault_step
    said = f"injected fault=diverge: {unit} {n}'s weights nudged by +{DIVERGE_NUDGE:g} at step {at}"
    if cfg.mode == "dp" and n == 0:
        return (f"{said}. Device 0 holds DP's one master copy, so the model itself changed for good; every later "
                "replica is broadcast from it, so the replicas stay in sync")
    if cfg.mode == "dp":
        return (f"{said}, after that step's broadcast: its gradient came from the drifted copy, and DP threw the copy "
                "away with the step's replicas (it broadcasts device 0's weights again every step), so the replicas "
                "cannot stay apart under DP")
    if cfg.mode == "fsdp":
        return (f"{said}, after its optimizer step. FSDP keeps no replicas (each rank holds a different shard), so "
                "the nudge changed that rank's shard of the one model, and no check can see it as a divergence")
    return (f"{said}, after its optimizer step; the replica check (every eval_every = {cfg.eval_every} steps and at "
            "the end) compares every rank's parameters")


def maybe_diverge(cfg: RunConfig, rank: int, step: int, model, tel=None) -> None:
    """With `fault=diverge`, nudge this replica's parameters so it no longer matches the others; `tel` (a
    `Telemetry`) gets a `log` event saying so (`diverge_note`)."""
    if cfg.fault == "diverge" and rank == cfg.fault_rank and step == cfg.fault_step:
        import torch

        with torch.no_grad():
            for p in model.parameters():
                p.add_(DIVERGE_NUDGE)
        if tel is not None:
            tel.emit("log", step=step, level="warning", message=diverge_note(cfg))


def maybe_fail(cfg: RunConfig, rank: int, step: int) -> None:
    """Fail here if `cfg` asks for a fault on this rank at this step."""
    if cfg.fault == "none" or rank != cfg.fault_rank or step != cfg.fault_step:
        return
    if cfg.fault == "raise":
        raise InjectedFault(f"injected fault: {unit_word(cfg.mode)} {rank} raised at step {step}", rank)
    if cfg.fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if cfg.fault == "hang":
        time.sleep(HANG_S)
