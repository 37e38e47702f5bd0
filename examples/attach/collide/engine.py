"""The script's own engine module (DETR and DeiT keep their training loop in one): one epoch of
training with a GradScaler, and an evaluation pass through the DDP module."""

import torch


def train_one_epoch(ddp, loader, opt, scaler, losses):
    """Steps take turns: `scaler.scale(loss).backward()`, `torch.autograd.backward(tensor)` and
    `torch.autograd.backward(generator)` (any iterable of tensors, which torch reads once).
    Appends each step's (unscaled) loss to `losses`; returns this rank's samples per step."""
    samples = []
    ddp.train()
    for i, (x, y) in enumerate(loader):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        if i % 3 == 0:
            scaler.scale(loss).backward()
        elif i % 3 == 1:
            torch.autograd.backward(scaler.scale(loss))
        else:
            torch.autograd.backward(t for t in [scaler.scale(loss)])
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
        samples.append(len(x))
    return samples


@torch.no_grad()
def evaluate(ddp, batches):
    """Forwards through the DDP module in eval mode under no_grad: no training samples."""
    ddp.eval()
    total = 0.0
    for x, y in batches:
        total += torch.nn.functional.mse_loss(ddp(x), y).item()
    ddp.train()
    return total / max(1, len(batches))
