"""The GPT starts where a language model starts and learns the prose (issue: GPT init).

References are independent of the code under test: ln(vocab) is the cross-entropy of a uniform
guess over the vocabulary (hand arithmetic), and 3.0 nats/char is a bar a character model of
this size clears on English prose within 200 AdamW steps (nanoGPT's shakespeare_char reaches
~2.5 by then) and the old N(0, 1)-embedding init did not (first loss ~42, 5.8 after 30 steps).
"""

from __future__ import annotations

import math

import pytest
import torch

from ddpviz.engine.components.training import loss_fn, micro_loss
from ddpviz.engine.config import RunConfig
from ddpviz.engine.data import load_dataset
from ddpviz.engine.events import ListSink
from ddpviz.engine.models import build_model
from ddpviz.engine.run import run_training

GPT = dict(model="gpt", dataset="text", width=64, depth=2, n_head=4, block_size=64,
           global_batch_size=32, optimizer="adamw", lr=3e-3, step_delay_s=0.0)


def test_gpt_first_loss_is_about_ln_vocab():
    cfg = RunConfig(mode="single", **GPT)
    ds = load_dataset(cfg)
    model = build_model(cfg, ds)
    with torch.no_grad():
        first = loss_fn(model(ds.x_train[:256]), ds.y_train[:256]).item()
    uniform = math.log(ds.n_classes)
    assert abs(first - uniform) / uniform < 0.10, (first, uniform)


def test_gpt_init_follows_nanogpt():
    cfg = RunConfig(mode="single", **{**GPT, "width": 128, "depth": 4})
    model = build_model(cfg, load_dataset(cfg))
    std = {n: p.detach().std().item() for n, p in model.named_parameters()}
    assert std["tok_emb.weight"] == pytest.approx(0.02, rel=0.05)
    assert std["blocks.0.attn.qkv.weight"] == pytest.approx(0.02, rel=0.05)
    assert std["blocks.0.mlp.2.weight"] == pytest.approx(0.02 / math.sqrt(2 * 4), rel=0.05)
    assert model.blocks[0].attn.qkv.bias.abs().max().item() == 0.0


@pytest.mark.slow
def test_gpt_learns_the_prose_in_200_steps():
    cfg = RunConfig(mode="single", steps=200, eval_every=0, **GPT)
    result = run_training(cfg, ListSink(), "gpt-learns")
    assert result.status == "succeeded", result.error
    assert result.summary["val_loss"] < 3.0, result.summary["val_loss"]


def _graph_ops(t: torch.Tensor) -> list[str]:
    """The autograd graph's node names from `t` back (the ops its backward runs)."""
    seen, todo = [], [t.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and node.name() not in seen:
            seen.append(node.name())
            todo += [n for n, _ in node.next_functions]
    return seen


def test_a_micro_batch_loss_divides_only_when_there_are_several():
    """One micro-batch a step (every plain loop): the loss itself, no division op in the forward or the
    backward, so the benchmarks' plain references and ddpviz's loops run the same ops; several: each a share."""
    torch.manual_seed(0)
    w = torch.randn(8, 3, requires_grad=True)
    out, y = torch.randn(5, 8) @ w, torch.tensor([0, 1, 2, 1, 0])
    plain = torch.nn.functional.cross_entropy(out, y)  # the reference: what a plain loop computes
    one = micro_loss(out, y, 1)
    assert torch.equal(one, plain) and "DivBackward0" not in _graph_ops(one)
    assert _graph_ops(one) == _graph_ops(loss_fn(out, y))
    four = micro_loss(out, y, 4)
    assert four.item() == pytest.approx(plain.item() / 4, rel=1e-6) and four.grad_fn.name() == "DivBackward0"
