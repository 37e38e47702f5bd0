"""Built-in models and the `ddpviz.models` plugin registry.

Every model maps a batch `x` to logits; the loss is cross-entropy over the last dimension
(`engine.components.training.loss_fn`). Size knobs (`width`, `depth`, `n_head`, `block_size`) scale the
parameter count, and so the bytes DP broadcasts and DDP all-reduces.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ddpviz.engine.config import RunConfig


class MLP(nn.Module):
    """`depth` hidden layers of `width` units. x: (B, in_dim) -> logits (B, n_classes)."""

    def __init__(self, in_dim: int, width: int, depth: int, n_classes: int):
        super().__init__()
        dims = [in_dim] + [width] * depth
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.head = nn.Linear(dims[-1], n_classes)

    @staticmethod
    def n_params(in_dim: int, width: int, depth: int, n_classes: int) -> int:
        """The parameters `__init__` creates, from the shapes alone (weights and biases of each Linear)."""
        dims = [in_dim] + [width] * depth
        return sum(a * b + b for a, b in zip(dims[:-1], dims[1:])) + width * n_classes + n_classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.hidden:
            x = F.relu(layer(x))  # (B, width)
        return self.head(x)  # (B, n_classes)


class CNN(nn.Module):
    """`depth` 3x3 conv blocks of `width` channels on 8x8 images. x: (B, 64) -> (B, n_classes)."""

    def __init__(self, side: int, width: int, depth: int, n_classes: int):
        super().__init__()
        self.side = side
        chans = [1] + [width] * depth
        self.convs = nn.ModuleList(nn.Conv2d(a, b, 3, padding=1) for a, b in zip(chans[:-1], chans[1:]))
        self.head = nn.Linear(width, n_classes)

    @staticmethod
    def n_params(width: int, depth: int, n_classes: int) -> int:
        """The parameters `__init__` creates: each 3x3 conv's weights and biases, then the head's."""
        chans = [1] + [width] * depth
        return sum(9 * a * b + b for a, b in zip(chans[:-1], chans[1:])) + width * n_classes + n_classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(x.size(0), 1, self.side, self.side)  # (B, 1, H, W)
        for conv in self.convs:
            x = F.relu(conv(x))  # (B, width, H, W)
        return self.head(x.mean(dim=(2, 3)))  # (B, n_classes)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention (nanoGPT). x: (B, T, C) -> (B, T, C)."""

    def __init__(self, width: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, width: int, n_head: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, n_head)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


INIT_STD = 0.02  # GPT-2 / nanoGPT init: N(0, 0.02) for Linear and Embedding weights


def _init_gpt_weights(module: nn.Module) -> None:
    """nanoGPT's `_init_weights`: Linear and Embedding weights ~ N(0, 0.02), biases 0.

    With the embedding tied to the output head, `nn.Embedding`'s own N(0, 1) init would make the
    first logits ~ N(0, width) and the first loss ~10x ln(vocab); at std 0.02 the logits start
    near 0 and the loss near ln(vocab), as a language model's should (Radford et al. 2019).
    LayerNorm keeps its (1, 0) init.
    """
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)


class GPT(nn.Module):
    """Decoder-only transformer with tied input/output embedding (nanoGPT, Karpathy 2022).

    x: (B, T) token ids, T <= block_size -> logits (B, T, vocab_size).
    """

    def __init__(self, vocab_size: int, block_size: int, width: int, depth: int, n_head: int):
        super().__init__()
        self.block_size = block_size
        self.tok_emb = nn.Embedding(vocab_size, width)
        self.pos_emb = nn.Embedding(block_size, width)
        self.blocks = nn.ModuleList(Block(width, n_head) for _ in range(depth))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # weight tying (Press & Wolf 2017)
        self.apply(_init_gpt_weights)
        for name, p in self.named_parameters():
            # Each block adds two residual branches (attention and MLP outputs); scaling their
            # projections by 1/sqrt(2·depth) keeps the residual stream's variance flat (GPT-2).
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=INIT_STD / math.sqrt(2 * depth))

    @staticmethod
    def n_params(vocab_size: int, block_size: int, width: int, depth: int) -> int:
        """The parameters `__init__` creates, the tied head counted once: the two embeddings, per block two
        LayerNorms (4w), qkv (3w² + 3w), proj (w² + w) and the MLP (4w² + 4w, 4w² + w): 12w² + 13w, then ln_f."""
        return (vocab_size + block_size) * width + depth * (12 * width * width + 13 * width) + 2 * width

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.size(1)
        pos = torch.arange(T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # (B, T, vocab)


def _build_builtin(cfg: RunConfig, ds) -> nn.Module:
    if cfg.model == "mlp":
        return MLP(ds.in_dim, cfg.width, cfg.depth, ds.n_classes)
    if cfg.model == "cnn":
        side = int(round(ds.in_dim ** 0.5))
        if side * side != ds.in_dim:
            raise ValueError(f"model 'cnn' needs square inputs; dataset '{cfg.dataset}' has {ds.in_dim} features")
        return CNN(side, cfg.width, cfg.depth, ds.n_classes)
    if cfg.model == "gpt":
        return GPT(ds.n_classes, cfg.block_size, cfg.width, cfg.depth, cfg.n_head)
    raise KeyError(cfg.model)


def build_model(cfg: RunConfig, ds) -> nn.Module:
    """Build `cfg.model` for dataset `ds` with the init seeded by `cfg.seed` (identical on every rank).

    Raises:
        KeyError: the name is neither built in nor a registered `ddpviz.models` plugin.
        TypeError: a plugin's `build(cfg)` returned something other than an `nn.Module` (every mode
            calls `.to`, `.parameters()` and `.train()` on it), naming what it returned.
    """
    torch.manual_seed(cfg.seed)
    if cfg.model in ("mlp", "cnn", "gpt"):
        return _build_builtin(cfg, ds)
    from ddpviz.engine.plugins import load_plugin

    model = load_plugin(cfg.model).build(cfg)
    if not isinstance(model, nn.Module):
        raise TypeError(f"build() must return an nn.Module (got {type(model).__name__})")
    return model


def builtin_param_count(cfg: RunConfig, ds) -> int | None:
    """Trainable parameters of built-in model `cfg.model` for dataset `ds`, from its class's shapes (`n_params`:
    nothing built), so a model too large for the host can be refused before it is built
    (`engine.components.preflight.check_model_fits`). None for a plugin (its `build` may do anything).
    Not PyTorch's meta device: a GPT's init there (`normal_` through torch._refs) imported torch._dynamo,
    1.4 s of CPU in every GPT run's launcher, which no rank-side work needed."""
    if cfg.model == "mlp":
        return MLP.n_params(ds.in_dim, cfg.width, cfg.depth, ds.n_classes)
    if cfg.model == "cnn":
        return CNN.n_params(cfg.width, cfg.depth, ds.n_classes)
    if cfg.model == "gpt":
        return GPT.n_params(ds.n_classes, cfg.block_size, cfg.width, cfg.depth)
    return None


def param_count(model: nn.Module) -> int:
    """Trainable parameters, counting a tied tensor once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def grad_bytes(model: nn.Module) -> int:
    """Bytes of one full gradient (what DDP all-reduces and DP reduces per step)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
