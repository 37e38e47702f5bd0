"""The Launch form's fields, defaults, actions and validation, without widgets (pure, testable).

Defaults come from `engine.config.RunConfig`, overlaid with a named `engine.config.PRESETS` entry;
validation is `engine.config.validate_config`, so the form refuses exactly what a worker would,
with the same ``(field, message)`` pairs.
"""

from __future__ import annotations

import typing
from typing import Any

from ddpviz.engine.config import (BUILTIN_MODELS, FSDP_FIELDS, PRESETS, ConfigError, RunConfig, plugin_model_names,
                           validate_config)

# (title, fields) of the form's three columns, then the "advanced" expander.
COLUMNS: list[tuple[str, list[str]]] = [
    ("Strategy", ["mode", "world_size", "bucket_cap_mb", "overlap", "comm_hook", "reshard_after_forward"]),
    ("Model and data", ["model", "dataset", "width", "depth"]),
    ("Training", ["global_batch_size", "steps", "lr", "optimizer", "seed", "step_delay_s"]),
]
ADVANCED = ["gradient_as_bucket_view", "static_graph", "find_unused_parameters", "broadcast_buffers",
            "grad_accum_steps", "amp", "fsdp_param_dtype", "fsdp_reduce_dtype", "device", "backend",
            "nnodes", "n_head", "block_size", "eval_every", "probe", "matrix_approximation_rank",
            "start_powerSGD_iter", "bucket_timing"]
FAULTS = ["fault", "fault_rank", "fault_step", "collective_timeout_s"]

# What one press of the form's button launches, first the default (the pair the README starts
# with): the choice above the form, and the button's text.
# Short: a segmented control does not wrap, and a segment past its column is cut (1024 px wide).
ACTIONS: dict[str, str] = {
    "pair": "DP and DDP",
    "trio": "single, DP, DDP, FSDP",
    "one": "one run",
}
ACTIONS_HELP = ("DP and DDP: the pair, side by side on Live; single, DP, DDP, FSDP: the set to "
                "compare; one run: any mode")
SUBMIT_TEXT: dict[str, str] = {
    "pair": "Launch DP and DDP",
    "trio": "Launch single, DP, DDP and FSDP",
    "one": "Launch one run",
}
# Fields an action sets itself or drops, so the form does not show them: the pair and the set
# give each run its own mode; the pair's DP and DDP take no FSDP-only field (`pair_values`).
IGNORED: dict[str, tuple[str, ...]] = {
    "pair": ("mode", *FSDP_FIELDS),
    "trio": ("mode",),
    "one": (),
}
PRESET_NAMES: dict[str, str] = {
    "default": "Default",
    "overlap": "Buckets overlap",
    "tiny": "Tiny (smoke test)",
}
PRESETS_HELP = ("Default: PyTorch's 25 MiB bucket cap, one bucket all-reduced after backward, no Python per "
                "bucket (bucket timing: recorder); Buckets overlap: a 0.1 MiB cap, two buckets, the first "
                "all-reduced while backward runs, each timed on every step (bucket timing: hook, so overlap % "
                "is measured); Tiny: fast, a small model")

HELP = {
    "mode": "dp: one process, a thread per device; ddp: a process per rank, each with a whole "
            "replica; fsdp: a process per rank, each holding 1/world_size of every parameter "
            "(FSDP2 fully_shard); single: one device (the baseline)",
    "world_size": "devices (DP) or rank processes (DDP, FSDP), >= 1",
    "reshard_after_forward": "FSDP: free each unit's gathered parameters after its forward and "
                             "all-gather them again for backward (less memory, 3(n−1)/n·P bytes "
                             "instead of 2(n−1)/n·P)",
    "fsdp_param_dtype": "FSDP: dtype of the all-gathered parameters and the compute (bfloat16 "
                        "halves the all-gather bytes; the shards and the optimizer stay float32)",
    "fsdp_reduce_dtype": "FSDP: dtype of the gradient reduce-scatter",
    "bucket_cap_mb": "DDP gradient bucket size cap, MiB (PyTorch default 25)",
    "overlap": "DDP: all-reduce each bucket as soon as it is ready; off defers every "
               "all-reduce until the last bucket is ready",
    "comm_hook": "DDP gradient compression, a PyTorch comm hook inside ddpviz's bucket timing: fp16/bf16 "
                 "cast each bucket for the all-reduce (half the bytes; bf16 needs NCCL: PyTorch refuses "
                 "it on gloo), powersgd sends low-rank factors. Bytes are counted on what the hook "
                 "sends; overlap must be on",
    "bucket_timing": "DDP: auto (default) is recorder on gloo, hook on NCCL; recorder adds nothing per bucket (DDP's own all-reduce): bytes, order and "
                     "DDP's own ready times every step on gloo (so exposed comm), all-reduce spans on the "
                     "profiled steps only (so overlap % is not measured on longer runs), enqueue times and GPU "
                     "durations on NCCL; hook times every bucket with a Python comm hook (ready, all-reduce "
                     "start and end, every step, so overlap %) for ~0.1-0.5 ms per bucket per step on gloo here "
                     "(docs/bucket-timing.md)",
    "matrix_approximation_rank": "PowerSGD: rank r of each gradient matrix's factors (comm_hook powersgd)",
    "start_powerSGD_iter": "PowerSGD: plain all-reduce before this iteration, > 1 (comm_hook powersgd)",
    "model": "built-in model (or an installed ddpviz.models plugin)",
    "dataset": "digits/synthetic for mlp and cnn; text/synthetic for gpt",
    "width": "mlp hidden units, cnn channels, gpt embedding size",
    "depth": "mlp hidden layers, cnn conv blocks, gpt layers",
    "global_batch_size": "samples per optimizer step over all devices; divisible by "
                         "world_size × grad_accum_steps",
    "steps": "optimizer steps",
    "lr": "learning rate",
    "seed": "model init and data order",
    "step_delay_s": "seconds to sleep per step, to slow a demo down",
    "broadcast_buffers": "DDP: send rank 0's module buffers (BatchNorm running statistics) to every "
                         "rank before each forward (PyTorch's default); off lets them drift apart",
    "grad_accum_steps": "micro-batches per optimizer step",
    "amp": "bf16 autocast",
    "device": "auto: CUDA when world_size GPUs are visible, else virtual CPU devices",
    "backend": "DDP process-group backend; auto: nccl on CUDA, gloo on CPU",
    "nnodes": "hosts a DDP run spans (world_size / nnodes ranks on each); needs a worker per host",
    "n_head": "gpt attention heads (width % n_head == 0)",
    "block_size": "gpt context length, tokens",
    "eval_every": "validation every N steps; 0 = at the end only",
    "probe": "DDP: after the last step, time all-reduces of 4 KiB..64 MiB one at a time on the "
             "run's process group (nccl-tests style, ~2 s at most) for the Theory page",
    "fault": "inject a failure to see what each strategy does: raise an exception, kill the "
             "process, hang in a collective (DDP), or let one replica diverge",
    "fault_rank": "the rank (DDP) or device (DP) that fails, < world_size",
    "fault_step": "the step at which it fails, < steps",
    "collective_timeout_s": "seconds a collective may wait before the run fails",
}


def defaults(preset: str = "default") -> dict[str, Any]:
    """Every RunConfig field's default, by name, with `preset`'s values (`engine.config.PRESETS`)
    over them.

    Raises:
        KeyError: `preset` is not a key of `PRESETS`.
    """
    return {**{name: f.default for name, f in RunConfig.model_fields.items()}, **PRESETS[preset]}


def choices(field: str) -> list[str] | None:
    """Allowed values of a choice field (Literal, or `model`), else None."""
    if field == "model":
        return sorted(set(BUILTIN_MODELS) | plugin_model_names(),
                      key=lambda m: (m not in BUILTIN_MODELS, m))
    ann = RunConfig.model_fields[field].annotation
    if typing.get_origin(ann) is typing.Literal:
        return list(typing.get_args(ann))
    return None


def kind(field: str) -> str:
    """Widget kind for a field: 'choice', 'bool', 'int' or 'float'."""
    if choices(field) is not None:
        return "choice"
    ann = RunConfig.model_fields[field].annotation
    return {bool: "bool", int: "int", float: "float"}.get(ann, "text")


def form_fields() -> list[str]:
    """Every field the form can show, in order."""
    return [f for _, fields in COLUMNS for f in fields] + ADVANCED + FAULTS


def shown(fields: list[str], action: str) -> list[str]:
    """`fields` less those `action` ("pair", "trio" or "one") ignores (`IGNORED`), in order."""
    return [f for f in fields if f not in IGNORED[action]]


def validation_errors(values: dict[str, Any]) -> list[tuple[str, str]]:
    """``(field, message)`` for every rule `values` breaks; empty when it is a valid RunConfig."""
    try:
        validate_config(values)
    except ConfigError as exc:
        return list(exc.errors)
    return []


def pair_values(values: dict[str, Any]) -> dict[str, Any]:
    """The config `submit_pair` receives: `values` with mode ddp (it makes the dp copy itself)
    and without the FSDP-only fields, which neither DP nor DDP takes."""
    return {**{k: v for k, v in values.items() if k not in FSDP_FIELDS}, "mode": "ddp"}


def set_values(values: dict[str, Any]) -> dict[str, Any]:
    """The config `submit_trio` receives (single, DP, DDP and FSDP): `values` as FSDP, whose
    fields are the others' plus the FSDP-only ones (`trio_configs` drops those for the others)."""
    return {**values, "mode": "fsdp"}
