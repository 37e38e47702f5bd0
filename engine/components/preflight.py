"""Checks on the model and data before any rank process starts.

Each failure is a `PreflightError` naming the field and the cause, so a mistake surfaces as one
sentence instead of a hang or a C++ traceback from inside DDP's reducer.

The checks run the model once, forward and backward, on a real micro-batch: the first one device
0 (DP, single) or rank 0 (DDP) trains on (`probe_batch`), so a model that needs its real batch
size (e.g. BatchNorm on half a batch) sees it. The probe leaves the model as it found it: its
buffers (BatchNorm's running statistics) are restored and the random number generators are
forked, so single and DP runs, which train this very module, start exactly where DDP's ranks do.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import torch
import torch.nn as nn

from ddpviz.engine.components.devices import PreflightError
from ddpviz.engine.components.training import OUTPUT_RULE, logits_of, loss_fn
from ddpviz.engine.config import RunConfig
from ddpviz.engine.data import BatchPlan, BatchPlanError


# fp32 copies of the model each device holds at least, per optimizer: weights and gradients, plus AdamW's two
# moments (exp_avg, exp_avg_sq; torch.optim.AdamW's state) or nothing for plain SGD (no momentum:
# engine.components.training.make_optimizer)
OPTIMIZER_COPIES = {"adamw": 2, "sgd": 0}
GIB = 1024 ** 3


def model_state_bytes(cfg: RunConfig, n_params: int, devices: int) -> tuple[int, int]:
    """A lower bound on the bytes `cfg` needs for its model on one host: (on the busiest device, on the whole
    host), for `devices` devices (ranks or DP devices) on that host, fp32 (4 B a parameter, `amp` keeps fp32
    parameters). Activations, DDP's buckets and the allocator's floor come on top, so a run can need more,
    never less. Per device: single and DDP's ranks hold weights, gradients and the optimizer's state
    (`OPTIMIZER_COPIES`); DP's device 0 the same, its other devices a replica's weights and gradients each
    step (`torch.nn.parallel.replicate`); FSDP's ranks a 1/world_size shard of all three."""
    state = 2 + OPTIMIZER_COPIES[cfg.optimizer]
    per = 4 * n_params
    if cfg.mode == "fsdp":
        device = -(-state * per // cfg.world_size)
        return device, device * devices
    if cfg.mode == "dp":
        return state * per, state * per + 2 * per * (devices - 1)
    return state * per, state * per * devices


def check_model_fits(cfg: RunConfig, plan, n_params: int | None, available: dict[str, int]) -> None:
    """Refuse a model whose `model_state_bytes` does not fit, before it is built (a 3.2 B-parameter model was
    accepted, and built, on a 24 GiB host: a new user, 2026-12-06). `plan` is the run's
    `engine.components.devices.DevicePlan`; `available` maps "host" to the host's available memory
    (psutil's `virtual_memory().available`) and, on CUDA, each device name to its total memory. A bound that
    fits says nothing: the run may still run out of memory later (activations).

    Raises:
        PreflightError: field ``width`` for a built-in model (width and depth size it), naming the parameters,
            the floor and what the host or device has.
    """
    if n_params is None:
        return
    device, host = model_state_bytes(cfg, n_params, len(plan.names))
    count = f"{n_params / 1e9:.2f} B" if n_params >= 1e9 else f"{n_params / 1e6:.1f} M"
    what = (f"the {cfg.model} model has {count} parameters: {cfg.mode} needs at least "
            f"{{need:.1f}} GiB {{where}} for fp32 weights, gradients"
            + (" and AdamW's two moments" if cfg.optimizer == "adamw" else "")
            + ", more than the {have:.1f} GiB {whose}; lower width or depth")
    if plan.kind == "cpu" and host > available.get("host", host):
        raise PreflightError("width", what.format(need=host / GIB, where=f"on this host ({len(plan.names)} "
                                                  f"{'device' if len(plan.names) == 1 else 'devices'})",
                                                  have=available["host"] / GIB, whose="this host has available"))
    if plan.kind == "cuda":
        name = plan.names[0]  # the busiest device: device 0 (DP) or any rank's (the others hold as much)
        if device > available.get(name, device):
            raise PreflightError("width", what.format(need=device / GIB, where=f"on {name}",
                                                      have=available[name] / GIB, whose=f"{name} has in all"))


def probe_batch(cfg: RunConfig, ds) -> tuple[torch.Tensor, torch.Tensor]:
    """The first micro-batch of device 0 / rank 0: `cfg.micro_batch_per_device` samples (DP,
    DDP), or the whole global micro-batch for `mode=single` (one device gets all of it).

    Raises:
        PreflightError: the dataset is too small for one such batch (the field `BatchPlanError`
            names: world_size when the ranks outnumber the training samples, else global_batch_size).
    """
    try:
        plan = BatchPlan(len(ds), cfg.world_size, cfg.micro_batch_per_device, cfg.seed)
    except BatchPlanError as exc:
        raise PreflightError(exc.field, str(exc)) from None
    idx = plan.global_indices(0) if cfg.mode == "single" else plan.rank_indices(0, 0)
    return ds.x_train[idx], ds.y_train[idx]


@contextlib.contextmanager
def probing(model: nn.Module) -> Iterator[nn.Module]:
    """Run a probe forward/backward on `model` without leaving a trace: gradients cleared,
    buffers restored, RNG state (CPU and CUDA) restored, train/eval mode kept."""
    saved = {name: b.detach().clone() for name, b in model.named_buffers()}
    was_training = model.training
    model.zero_grad(set_to_none=True)
    try:
        with torch.random.fork_rng(devices=[]):
            model.train()
            yield model
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
        with torch.no_grad():
            for name, b in model.named_buffers():
                if name in saved and saved[name].shape == b.shape:
                    b.copy_(saved[name])


def ddp_tolerates_unused(cfg: RunConfig) -> bool:
    """Whether DDP, as configured, trains a model some of whose parameters get no gradient.

    `find_unused_parameters=True` finds them every iteration (`Reducer::prepare_for_backward`);
    `static_graph=True` records them in the first iteration (`Reducer::delay_all_reduce`) and
    marks them ready from then on, as long as the same ones stay unused
    (torch/nn/parallel/distributed.py, `static_graph`). Otherwise the reducer waits for their
    buckets and the next iteration fails.
    """
    return cfg.find_unused_parameters or cfg.static_graph


def unused_parameters(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[str]:
    """Names of trainable parameters that get no gradient from one forward/backward on (x, y).

    The model is left as found (`probing`).
    """
    with probing(model):
        loss_fn(model(x), y).backward()
        return [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]


def check_labels(logits: torch.Tensor, y: torch.Tensor, ds) -> None:
    """Labels must be class ids in [0, C) for a model with C logits, shaped like the logits
    without their last dimension (what `torch.nn.functional.cross_entropy` needs).

    Raises:
        PreflightError: field ``dataset``, naming the labels found and the model's C.
    """
    n_out = logits.size(-1)
    if tuple(logits.shape[:-1]) != tuple(y.shape):
        raise PreflightError("dataset", f"labels must have the model output's shape without its last "
                             f"dimension: the model returns logits {tuple(logits.shape)} for labels "
                             f"{tuple(y.shape)} of dataset '{ds.name}'")
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise PreflightError("dataset", f"labels must be integer class ids (torch.long); dataset "
                             f"'{ds.name}' has {y.dtype} labels")
    labels = torch.cat([ds.y_train.reshape(-1), ds.y_val.reshape(-1)])
    lo, hi = int(labels.min()), int(labels.max())
    if lo < 0 or hi >= n_out:
        raise PreflightError("dataset", f"labels must be class ids in [0, {n_out}) for a model with "
                             f"{n_out} outputs; dataset '{ds.name}' has labels {lo}..{hi} "
                             f"({hi + 1} classes). Give the model {hi + 1} outputs, or the data "
                             f"{n_out} classes")


def probe_output(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The logits of one probe forward (no gradients kept).

    Raises:
        PreflightError: field ``model``, when the output has no logits in a supported place.
    """
    with probing(model), torch.no_grad():
        try:
            return logits_of(model(x))
        except TypeError as exc:
            if OUTPUT_RULE in str(exc):
                raise PreflightError("model", str(exc)) from None
            raise


def check_validation_split(ds) -> None:
    """A run evaluates on the validation split (every `eval_every` steps and at the end), so the
    split must hold samples: an empty one would give a made-up loss and accuracy.

    Raises:
        PreflightError: field ``dataset``, naming the dataset and its 0 validation samples.
    """
    if len(ds.x_val) == 0:
        raise PreflightError("dataset", f"dataset '{ds.name}' has 0 validation samples: every run "
                             f"evaluates on the validation split (eval_every and at the end); give "
                             f"the dataset a validation split (Dataset.x_val, y_val)")


def compiled_modules(model: nn.Module) -> list[str]:
    """Names of the `torch.compile`d modules (`OptimizedModule`) in `model` (`""` for the model
    itself). Without torch._dynamo imported nothing can have been compiled, so it is not imported."""
    dynamo = sys.modules.get("torch._dynamo.eval_frame")
    if dynamo is None:
        return []
    return [name for name, m in model.named_modules() if isinstance(m, dynamo.OptimizedModule)]


def check_dp_replicable(cfg: RunConfig, model: nn.Module) -> None:
    """DP builds new replicas of the model every step (`torch.nn.parallel.replicate`, and ddpviz's
    CPU emulation of it); neither can copy a compiled module. `replicate` calls
    `Module._replicate_for_data_parallel` on every module, which sets the replica's
    `_parameters = {}`; an `OptimizedModule` forwards that assignment to the module it wraps
    (torch/_dynamo/eval_frame.py, `OptimizedModule.__setattr__`), so device 0's own module loses
    its parameters.

    Raises:
        PreflightError: field ``mode``, with mode dp and a compiled module, offering DDP.
    """
    compiled = compiled_modules(model) if cfg.mode == "dp" else []
    if compiled:
        where = ", ".join(repr(n) if n else "the model itself" for n in compiled[:4])
        raise PreflightError("mode", f"mode 'dp' cannot train a torch.compile'd model ({where} compiled): "
                             f"torch.nn.parallel.replicate cannot copy compiled modules (its "
                             f"_replicate_for_data_parallel empties the replica's parameters, which a "
                             f"compiled module passes on to device 0's original); use mode 'ddp', which "
                             f"runs compiled models")


def check_model(cfg: RunConfig, model: nn.Module, ds) -> None:
    """Refuse models DP/DDP cannot train as configured.

    Raises:
        PreflightError: an empty validation split (`check_validation_split`); a compiled model
            with DP (`check_dp_replicable`); no trainable parameters; a zero-size parameter; SyncBatchNorm with DP or on
            CPU; an output without logits where `logits_of` looks; labels outside the model's
            outputs; a parameter that never receives a gradient when DDP, as configured, does not
            tolerate one (`ddp_tolerates_unused`: it would wait forever for its bucket).
    """
    check_validation_split(ds)
    check_dp_replicable(cfg, model)
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
    x, y = probe_batch(cfg, ds)
    check_labels(probe_output(model, x), y, ds)
    if cfg.mode == "ddp" and not ddp_tolerates_unused(cfg):
        unused = unused_parameters(model, x, y)
        if unused:
            raise PreflightError(
                "find_unused_parameters",
                f"parameters never receive a gradient: {', '.join(unused[:8])}"
                f"{' ...' if len(unused) > 8 else ''}; DDP would wait for them forever. "
                "Set find_unused_parameters=true (or static_graph=true if the same ones are "
                "always unused), or remove them from the model")
