"""Checks on the model and data before any rank process starts.

Each failure is a `PreflightError` naming the field and the cause, so a mistake surfaces as one
sentence instead of a hang or a C++ traceback from inside DDP's reducer.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from engine.config import RunConfig
from engine.devices import PreflightError
from engine.training import loss_fn

PROBE_SAMPLES = 2  # samples in the probe forward/backward that finds parameters without gradients


def unused_parameters(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[str]:
    """Names of trainable parameters that get no gradient from one forward/backward on (x, y).

    The model's gradients are cleared afterwards; parameters are not changed.
    """
    model.zero_grad(set_to_none=True)
    loss_fn(model(x), y).backward()
    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    model.zero_grad(set_to_none=True)
    return unused


def check_model(cfg: RunConfig, model: nn.Module, ds) -> None:
    """Refuse models DP/DDP cannot train as configured.

    Raises:
        PreflightError: no trainable parameters; a zero-size parameter; SyncBatchNorm with DP or on
            CPU; a parameter that never receives a gradient while find_unused_parameters is False
            (DDP would wait forever for its bucket).
    """
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not params:
        raise PreflightError("model", f"model '{cfg.model}' has no trainable parameters")
    empty = [n for n, p in params if p.numel() == 0]
    if empty:
        raise PreflightError("model", f"model '{cfg.model}' has zero-size parameters: {', '.join(empty)}")
    if any(isinstance(m, nn.SyncBatchNorm) for m in model.modules()):
        if cfg.mode == "dp":
            raise PreflightError("mode", "SyncBatchNorm works only with DDP, not DP")
        if cfg.device != "cuda":
            raise PreflightError("device", "SyncBatchNorm needs CUDA devices; on CPU use BatchNorm")
    if cfg.mode == "ddp" and not cfg.find_unused_parameters:
        unused = unused_parameters(model, ds.x_train[:PROBE_SAMPLES], ds.y_train[:PROBE_SAMPLES])
        if unused:
            raise PreflightError(
                "find_unused_parameters",
                f"parameters never receive a gradient: {', '.join(unused[:8])}"
                f"{' ...' if len(unused) > 8 else ''}; DDP would wait for them forever. "
                "Set find_unused_parameters=true, or remove them from the model")
