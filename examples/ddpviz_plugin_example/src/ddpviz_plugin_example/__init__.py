"""A ddpviz model plugin: a residual MLP trained on the real digits."""

import torch.nn as nn

from ddpviz.engine.data import load_dataset
from ddpviz.engine.plugins import ModelPlugin


class ResMLP(nn.Module):
    def __init__(self, width: int, depth: int):
        super().__init__()
        self.inp = nn.Linear(64, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())
                                    for _ in range(depth))
        self.out = nn.Linear(width, 10)

    def forward(self, x):  # (B, 64) -> (B, 10)
        x = self.inp(x)
        for block in self.blocks:
            x = x + block(x)
        return self.out(x)


plugin = ModelPlugin(build=lambda cfg: ResMLP(cfg.width, cfg.depth),
                     dataset=lambda cfg: load_dataset(cfg.model_copy(update={"model": "mlp", "dataset": "digits"})),
                     description="residual MLP on the digits")
