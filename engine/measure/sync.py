"""Checksums that tell whether copies of a model agree: parameters and buffers, per rank.

A checksum is ``[Σx, Σx²]`` over the tensors in float64: equal on copies that hold equal values
(the test DDP's replica check and the DP check at forward rely on), and cheap to all-gather.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.nn as nn


@torch.no_grad()
def tensors_checksum(tensors: Iterable[torch.Tensor]) -> list[float]:
    """[Σx, Σx²] over every element of `tensors`, in float64."""
    s = torch.zeros(2, dtype=torch.float64)
    for t in tensors:
        d = t.detach().double().cpu()
        s[0] += d.sum()
        s[1] += (d * d).sum()
    return s.tolist()


def param_checksum(model: nn.Module) -> list[float]:
    """[Σx, Σx²] of all of `model`'s parameters, in float64: equal on replicas that are in sync."""
    return tensors_checksum(model.parameters())


@torch.no_grad()
def buffer_checksums(model: nn.Module) -> torch.Tensor:
    """(n_buffers, 2) float64: [Σx, Σx²] of each of `model`'s buffers, in `named_buffers` order."""
    rows = [tensors_checksum([b]) for _, b in model.named_buffers()]
    return torch.tensor(rows, dtype=torch.float64).reshape(len(rows), 2)
