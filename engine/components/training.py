"""Pieces every mode shares: loss, optimizer, evaluation, parameter checksums, devices.

The loss is cross-entropy over the last dimension, averaged over every sample (and token), so a
mean over the global batch equals the average of equal-sized per-rank means — the identity DDP's
gradient averaging relies on (PyTorch DDP docs, "gradients are averaged across ranks").

A model's forward may return its logits as a tensor, as the first element of a tuple (or list),
or under the key ``"logits"`` of a dict (Hugging Face's `ModelOutput` is one); `logits_of` picks
them out, in every mode (README, "Your own model").
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F

from ddpviz.engine.config import RunConfig
from ddpviz.engine.data import Dataset

EVAL_BATCH = 512  # samples per validation forward


OUTPUT_RULE = ("a model's forward must return its logits as a tensor, as the first element of a "
               "tuple or list, or under the key 'logits' of a dict")


def logits_of(output) -> torch.Tensor:
    """The logits in a model's output: the tensor itself, `output[0]` of a tuple or list, or
    `output["logits"]` of a dict (any `Mapping`, e.g. Hugging Face's `ModelOutput`).

    Raises:
        TypeError: any other output, naming the rule (`OUTPUT_RULE`) and what came instead.
    """
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    if isinstance(output, Mapping) and isinstance(output.get("logits"), torch.Tensor):
        return output["logits"]
    got = type(output).__name__
    if isinstance(output, Mapping):
        got += f" with keys {sorted(map(str, output))[:6]}"
    elif isinstance(output, (tuple, list)):
        got += f" whose first element is {type(output[0]).__name__ if output else 'missing'}"
    raise TypeError(f"{OUTPUT_RULE} (got {got})")


def loss_fn(output, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of a model's output (`logits_of`). logits: (B, C) or (B, T, C);
    y: (B,) or (B, T) class ids."""
    logits = logits_of(output)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))


def micro_loss(output, y: torch.Tensor, accum: int) -> torch.Tensor:
    """`loss_fn` of one of a step's `accum` micro-batches, divided by `accum` so that their gradients
    add up to the step's mean. At `accum == 1` the loss itself: a division by 1 changes no value but is
    one more op in the forward and in the backward (`DivBackward0`), which a plain training loop does
    not run, so every loop of ours (and the benchmarks' plain references) scales through here."""
    loss = loss_fn(output, y)
    return loss / accum if accum > 1 else loss


def make_optimizer(cfg: RunConfig, params) -> torch.optim.Optimizer:
    """SGD (no momentum, so k steps are easy to reproduce) or AdamW (weight_decay 0.01)."""
    params = list(params)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.01)


def autocast(cfg: RunConfig, device_type: str):
    """bf16 autocast when `cfg.amp`, else a no-op context."""
    if cfg.amp:
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def evaluate(model: nn.Module, ds: Dataset, device: torch.device) -> tuple[float, float]:
    """Validation (mean loss, accuracy in [0, 1]) over the whole held-out split.

    Raises:
        ValueError: the split is empty (pre-flight refuses such a dataset first,
            `engine.components.preflight.check_validation_split`): no number is made up.
    """
    if len(ds.x_val) == 0:
        raise ValueError(f"dataset '{ds.name}' has 0 validation samples")
    was_training = model.training
    model.eval()
    total_loss, correct, count = 0.0, 0, 0
    for i in range(0, len(ds.x_val), EVAL_BATCH):
        x, y = ds.x_val[i:i + EVAL_BATCH].to(device), ds.y_val[i:i + EVAL_BATCH].to(device)
        logits = logits_of(model(x))
        n = y.numel()
        total_loss += loss_fn(logits, y).item() * n
        correct += (logits.argmax(-1) == y).sum().item()
        count += n
    model.train(was_training)
    return total_loss / count, correct / count


@torch.no_grad()
def flat_params(model: nn.Module) -> torch.Tensor:
    """All parameters concatenated, float32 on CPU: (P,)."""
    return torch.cat([p.detach().float().cpu().reshape(-1) for p in model.parameters()])


def cpu_threads_per_rank(world_size: int) -> int:
    """Intra-op threads of one virtual CPU device: the host's cores split evenly over world_size.

    DDP ranks, DP device threads and the single-device baseline (one such device) all get this
    budget, so "speed-up vs single" compares one device with N of the same size, and OpenMP is
    never asked for more threads than there are cores (oversubscribed spinning threads can make a
    step 100x slower).
    """
    return max(1, (os.cpu_count() or 1) // world_size)


@contextlib.contextmanager
def cpu_device_threads(world_size: int):
    """Run the block with `cpu_threads_per_rank(world_size)` intra-op threads, then restore."""
    before = torch.get_num_threads()
    torch.set_num_threads(cpu_threads_per_rank(world_size))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def should_eval(cfg: RunConfig, step: int) -> bool:
    """Validate every `eval_every` steps (if > 0) and after the last step."""
    last = step == cfg.steps - 1
    return last or (cfg.eval_every > 0 and (step + 1) % cfg.eval_every == 0)


def batch_to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A batch tensor on `device`. On CUDA through pinned memory and a non-blocking copy, as a
    `DataLoader(pin_memory=True)` hands batches over: a copy from pageable memory waits for the stream
    (PyTorch's `memcpy_and_sync`), which a DDP rank's deferred step must not (`engine.measure.deferred`);
    the pinned block is kept until the copy completed (the caching host allocator records an event on
    the copy's stream). Elsewhere `t.to(device)`."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
