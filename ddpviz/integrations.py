"""Callbacks for frameworks that own the training loop: the Hugging Face Trainer and PyTorch Lightning.

    from ddpviz.integrations import HuggingFaceCallback
    Trainer(model, args, train_dataset=ds, callbacks=[HuggingFaceCallback(name="bert, 2 ranks")])

    from ddpviz.integrations import LightningCallback
    lightning.Trainer(callbacks=[LightningCallback()])

    # record it:  ddpviz run -- torchrun --nproc-per-node 2 train.py

Neither framework is a dependency of ddpviz: each class is built from the framework's own base class
the first time it is imported from here (`__getattr__`), so importing ddpviz never imports them;
asking for one whose framework is not installed raises ImportError naming the package. What the
callbacks do fails open like `ddpviz.watch` and `ddpviz.step`.

- `HuggingFaceCallback`: at ``on_train_begin``, `ddpviz.watch` on the Trainer's model and optimizer
  (the DDP the Trainer builds is watched by ``ddpviz run`` itself); steps end at the optimizer's
  step, which the Trainer calls once per ``gradient_accumulation_steps`` batches (its ``global_step``);
  at ``on_train_end``, the events are written out.
- `LightningCallback`: at ``on_fit_start``, `ddpviz.watch` on the LightningModule and
  ``trainer.optimizers``. Automatic optimization: steps end at the optimizer's step (Lightning runs
  forward and backward in the step's closure; `engine.attach.steps` counts that). Manual
  optimization (``automatic_optimization = False``, e.g. a GAN with two optimizers): steps are
  explicit, one per training batch (``on_train_batch_end``), with the batch's leading dimension as
  samples and the loss `training_step` returned (a tensor, or a dict's ``"loss"``). Under DDP,
  Lightning runs the whole manual `training_step` inside the DDP module's forward, so that step's
  ``forward_s`` holds its backward and optimizer time too.
"""

from __future__ import annotations

from typing import Any

import ddpviz

__all__ = ["HuggingFaceCallback", "LightningCallback"]
_BUILT: dict[str, type] = {}


def __getattr__(name: str) -> type:
    """The callback class `name`, built from its framework on first use.

    Raises:
        ImportError: the framework is not installed.
        AttributeError: no such callback.
    """
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _BUILT:
        _BUILT[name] = _build_huggingface() if name == "HuggingFaceCallback" else _build_lightning()
    return _BUILT[name]


def _build_huggingface() -> type:
    try:
        from transformers import TrainerCallback
    except ImportError as exc:
        raise ImportError("ddpviz.integrations.HuggingFaceCallback needs the `transformers` package") from exc

    class HuggingFaceCallback(TrainerCallback):
        """Records a Hugging Face Trainer's run in the ``ddpviz run`` that started it (module docstring).

        Args:
            name: the run's label in the app (as `ddpviz.watch`'s `name`).
        """

        def __init__(self, name: str | None = None):
            self.name = name
            self.watched: ddpviz.Watched | None = None

        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                           **kwargs: Any) -> None:
            self.watched = ddpviz.watch(model, optimizer, name=self.name)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.watched is not None:
                self.watched.flush()

    return HuggingFaceCallback


def _build_lightning() -> type:
    try:
        from lightning.pytorch.callbacks import Callback
    except ImportError:
        try:
            from pytorch_lightning.callbacks import Callback
        except ImportError as exc:
            raise ImportError("ddpviz.integrations.LightningCallback needs the `lightning` "
                              "(or `pytorch_lightning`) package") from exc

    class LightningCallback(Callback):
        """Records a Lightning Trainer's fit in the ``ddpviz run`` that started it (module docstring).

        Args:
            name: the run's label in the app (as `ddpviz.watch`'s `name`).
        """

        def __init__(self, name: str | None = None):
            self.name = name
            self.watched: ddpviz.Watched | None = None
            self.explicit = False

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            self.explicit = not getattr(pl_module, "automatic_optimization", True)
            self.watched = ddpviz.watch(pl_module, list(getattr(trainer, "optimizers", None) or []) or None,
                                        name=self.name, steps="explicit" if self.explicit else "optimizer")

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if self.explicit:
                ddpviz.step(samples=_leading_dim(batch), loss=_loss(outputs))

        def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
            if self.watched is not None:
                self.watched.flush()

    return LightningCallback


def _leading_dim(batch: Any) -> int | None:
    """The leading dimension of the first tensor in `batch` (a tensor, or lists, tuples, dicts of
    them), or None without one."""
    from ddpviz.engine.attach.steps import batch_samples

    return batch_samples((batch,), {}) or None


def _loss(outputs: Any) -> Any:
    """What `training_step` returned, as a loss: a one-element tensor, or a dict's ``"loss"``; else None."""
    import torch

    if isinstance(outputs, dict):
        outputs = outputs.get("loss")
    return outputs if isinstance(outputs, torch.Tensor) and outputs.numel() == 1 else None
