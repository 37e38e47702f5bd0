"""The job spec: `RunConfig`, validated before anything runs.

This module imports no torch, so the app and the Redis client can validate a job cheaply.
Every refusal is a `ConfigError` whose message names the field and the rule, e.g.
``world_size must be >= 1 (got 0)``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

SCHEMA_VERSION = 1  # version of the event schema, carried in `run_started`

# How DDP's buckets are recorded (docs/bucket-timing.md): "hook" = ddpviz's Python comm hook on every
# bucket; "recorder" = no hook, DDP's own C++ all-reduce. The one home of these names: `RunConfig`
# (launched runs) and `ddpviz run --bucket-timing` (attached runs, engine/attach/env.py) both use them.
# Either may also say "auto" (the default of both since 2026-12-06): `resolve_bucket_timing` picks by backend.
BUCKET_TIMINGS: tuple[str, ...] = ("hook", "recorder")
BUCKET_TIMING_CHOICES: tuple[str, ...] = ("auto",) + BUCKET_TIMINGS
BucketTiming = Literal["hook", "recorder", "auto"]


def resolve_bucket_timing(timing: str, backend: str, find_unused_parameters: bool = False) -> str:
    """"hook" or "recorder" for a DDP on `backend` ("gloo", "nccl", ...): `timing` itself, or for "auto"
    the recorder on gloo and the hook on any other backend (`effective_bucket_timing` says why), and the hook
    under `find_unused_parameters`: there DDP never rebuilds its buckets, so its reducer logs no parameter
    indices to read ready times by, and it all-reduces its map of used parameters beside the buckets, so a
    sampled step's profile does not pair up either: the recorder measured no time at all (a new user's
    trial, 2026-12-06)."""
    if timing != "auto":
        return timing
    return "recorder" if backend == "gloo" and not find_unused_parameters else "hook"


def effective_bucket_timing(cfg: "RunConfig", backend: str) -> str:
    """"hook" or "recorder" for a launched DDP run on `backend` ("gloo" or "nccl"): the config's, or
    for "auto" the recorder on gloo (no Python per bucket; ready times and exposed comm from DDP's
    reducer every step) and the hook on NCCL (every bucket's GPU spans every step). There the recorder
    path, which read PyTorch's flight-recorder dump every step (11.4-12.6 µs per entry held on an H100),
    was no lighter: ddpviz ÷ plain DDP 1.030-1.048x (recorder) vs 1.042-1.049x (hook) on a 99.5 M GPT,
    1.29-1.49x vs 1.28-1.49x on a small one (docs/gpu/2026-12-05-h100). Since 2026-12-05 (night) it reads
    only DDP's reducer (bytes, order, host launch times; `engine.modes.ddp.reducer.LayoutBuckets`), not yet
    measured on a GPU: "auto" stays the hook on NCCL until a GPU run shows that path's cost."""
    return resolve_bucket_timing(cfg.bucket_timing, backend, cfg.find_unused_parameters)

BUILTIN_MODELS = ("mlp", "cnn", "gpt")
FSDP_FIELDS = ("reshard_after_forward", "fsdp_param_dtype", "fsdp_reduce_dtype")  # mode fsdp only
COMM_HOOK_FIELDS = ("comm_hook", "matrix_approximation_rank", "start_powerSGD_iter")  # mode ddp only
DATASETS = ("digits", "text", "synthetic")
# Which datasets each built-in model trains on (the first is the default).
MODEL_DATASETS: dict[str, tuple[str, ...]] = {
    "mlp": ("digits", "synthetic"),
    "cnn": ("digits", "synthetic"),
    "gpt": ("text", "synthetic"),
}
# Named starting points (the Launch form's "Preset"): the RunConfig fields each one changes from
# the defaults. "overlap" caps buckets at 0.1 MiB, so the default model's 202 KB of gradients span 2
# buckets and the first is all-reduced while backward still runs (the default until issue 33: on 2
# CPU cores it put DDP ahead beyond noise in 1 of 4 pairs, its second all-reduce one more wait for
# the slower rank). "tiny" is the defaults before that (mlp 128×3, global batch 64; README "What to
# expect on a 2-core laptop"): fast, one bucket.
PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    # small buckets overlapping backward, each all-reduce timed on every step (the hook: its cost, issue 31)
    "overlap": {"bucket_cap_mb": 0.1, "bucket_timing": "hook"},
    "tiny": {"width": 128, "depth": 3, "global_batch_size": 64},
}


class ConfigError(ValueError):
    """A job spec broke a rule. `.errors` lists ``(field, message)`` pairs."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__("; ".join(msg for _, msg in errors))


class RunConfig(BaseModel):
    """One training run: strategy, model, data and every DDP knob.

    Sizes are in samples, bytes or MiB as each name says; times in seconds.
    Defaults give a DDP run of about 20 s on 2 CPU cores (mlp on digits).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # nan read "must be <= 10.0"

    mode: Literal["dp", "ddp", "fsdp", "single"] = "ddp"  # single = one device, same global batch
    world_size: int = Field(2, ge=1, le=64)  # devices (DP) or rank processes (DDP, FSDP)
    nnodes: int = Field(1, ge=1, le=64)  # hosts a DDP run spans (world_size // nnodes ranks each)
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: CUDA if world_size GPUs, else CPU
    backend: Literal["auto", "gloo", "nccl"] = "auto"  # DDP process-group backend
    model: str = Field("mlp", min_length=1, max_length=64)  # a built-in or a `ddpviz.models` plugin
    # Defaults chosen by measurement on a 2-core CPU (README "The default pair"): a narrow, deep
    # MLP, where the per-op Python work DP's threads queue for (the GIL), device 0's serial work and
    # the per-step replica rebuild decide DP vs DDP. The former defaults (faster, one bucket) are
    # PRESETS["tiny"]: --width 128 --depth 3 --global-batch-size 64.
    width: int = Field(64, ge=1, le=8192)  # mlp hidden units, cnn channels, gpt n_embd
    # 12 by default: DP's per-layer Python in its device threads and its copies grow with depth, so
    # the default pair shows them (DDP 1.32-1.34x DP here; 64x8 gave 1.15-1.17x: README, DP vs DDP)
    depth: int = Field(12, ge=1, le=48)  # mlp hidden layers, cnn conv blocks, gpt n_layer
    n_head: int = Field(4, ge=1, le=64)  # gpt attention heads (width % n_head == 0)
    block_size: int = Field(64, ge=2, le=2048)  # gpt context length, tokens
    dataset: Literal["digits", "text", "synthetic"] = "digits"
    # 256 by default: why, and what the default pair measured with it (and with 32): docs/verdict.md
    global_batch_size: int = Field(256, ge=1, le=65536)  # samples per optimizer step, all devices
    steps: int = Field(300, ge=1, le=1_000_000)  # optimizer steps
    lr: float = Field(1e-3, gt=0.0, le=10.0)  # learning rate (AdamW 1e-3: the demo learns)
    optimizer: Literal["sgd", "adamw"] = "adamw"
    seed: int = Field(0, ge=0, le=2**31 - 1)  # model init and data order
    # DDP bucket size cap, MiB: PyTorch's default, 25, so the default model's 202 KB of gradients are
    # one bucket, all-reduced once after backward (how the default pair was chosen: docs/verdict.md).
    # PRESETS["overlap"] (0.1) shows buckets overlapping backward.
    bucket_cap_mb: float = Field(25.0, gt=0.0, le=4096.0)
    overlap: bool = True  # False: defer every all-reduce until the last bucket is ready
    # DDP bucket records (issue 31, docs/bucket-timing.md): "recorder" = no comm hook, DDP's own C++
    # all-reduce, so no Python per bucket (cost per bucket within noise of 0 here): bytes, parameters and
    # order from DDP's reducer and, on gloo, every bucket's ready time (the reducer's own stamps) and the
    # step's exposed comm, every step; all-reduce start and end on the profiled (memory-traced) steps, so
    # overlap % is "not measured" on longer runs; on CUDA each bucket's host launch (the same stamps), no
    # GPU times. "hook" = ddpviz's Python comm hook on every bucket: ready, start and end measured
    # on every step, for ~0.1-0.5 ms per bucket per step on gloo here (PRESETS["overlap"] uses it).
    # "auto" (default): recorder on gloo, hook on NCCL (`effective_bucket_timing`). Sparse gradients,
    # overlap=false and comm_hook need the hook and use it whatever this says (engine/modes/ddp/flight.py)
    bucket_timing: BucketTiming = "auto"
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    find_unused_parameters: bool = False
    broadcast_buffers: bool = True  # DDP: rank 0's buffers (e.g. BatchNorm statistics) sent to all before each forward
    # DDP gradient compression: a PyTorch comm hook run inside ddpviz's bucket recording
    # (engine/modes/ddp/comm_hooks.py): fp16/bf16 cast each bucket for the all-reduce (half the
    # bytes), powersgd sends low-rank factors (Vogels et al. 2019, torch's powerSGD_hook)
    comm_hook: Literal["none", "fp16", "bf16", "powersgd"] = "none"
    matrix_approximation_rank: int = Field(1, ge=1, le=64)  # PowerSGD: rank r of each gradient matrix's factors
    start_powerSGD_iter: int = Field(2, ge=2, le=1_000_000)  # PowerSGD: plain all-reduce before this iteration (> 1: PyTorch's rule with error feedback)
    grad_accum_steps: int = Field(1, ge=1, le=1024)  # micro-batches per optimizer step
    amp: bool = False  # bf16 autocast
    # FSDP (mode fsdp) knobs, named as in torch.distributed.fsdp.fully_shard / MixedPrecisionPolicy.
    # Separate from `amp` (op-level autocast, fp32 parameters): these set the dtype FSDP all-gathers
    # parameters in and reduce-scatters gradients in, so they change the bytes moved.
    reshard_after_forward: bool = True  # free each unit's gathered parameters after its forward
    fsdp_param_dtype: Literal["float32", "bfloat16"] = "float32"  # all-gather and compute dtype
    fsdp_reduce_dtype: Literal["float32", "bfloat16"] = "float32"  # reduce-scatter dtype
    eval_every: int = Field(25, ge=0, le=1_000_000)  # validation every N steps; 0 = at end only
    step_delay_s: float = Field(0.05, ge=0.0, le=5.0)  # pause after each step so a demo can be watched; not in step times
    probe: bool = True  # DDP, world_size >= 2: after training, time all-reduces of 4 KiB..64 MiB alone (engine/modes/ddp/probe.py)
    collective_timeout_s: float = Field(60.0, ge=1.0, le=3600.0)  # a collective waiting longer fails the run
    fault: Literal["none", "raise", "kill", "hang", "diverge"] = "none"  # inject a failure, to see what it does
    fault_rank: int = Field(0, ge=0, le=63)  # the rank (DDP) or device (DP) that fails
    fault_step: int = Field(0, ge=0, le=1_000_000)  # the step at which it fails

    @model_validator(mode="after")
    def _cross_field_rules(self) -> "RunConfig":
        errors = cross_field_errors(self)
        if errors:
            raise ValueError(" | ".join(f"{f}: {m}" for f, m in errors))
        return self

    @property
    def micro_batch_per_device(self) -> int:
        """Samples each device processes per forward (global / world_size / grad_accum_steps)."""
        return self.global_batch_size // (self.world_size * self.grad_accum_steps)

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def devices_used(cfg: dict[str, Any]) -> int | None:
    """The devices a run trained on: its `world_size` (None if the config has none), except a single run's,
    which is one device (its config keeps the set's world size: it computes that many devices' global batch
    on one)."""
    return 1 if cfg.get("mode") == "single" else cfg.get("world_size")


def cross_field_errors(cfg: RunConfig) -> list[tuple[str, str]]:
    """Rules that tie fields together; each names its field and the rule."""
    errs: list[tuple[str, str]] = []
    per_step = cfg.world_size * cfg.grad_accum_steps
    if cfg.global_batch_size < cfg.world_size:
        errs.append(("global_batch_size",
                     f"global_batch_size must be >= world_size ({cfg.world_size}), "
                     f"so every device gets at least one sample (got {cfg.global_batch_size})"))
    elif cfg.global_batch_size % per_step:
        sizes = _scatter_sizes(cfg.global_batch_size // cfg.grad_accum_steps, cfg.world_size)
        errs.append(("global_batch_size",
                     f"global_batch_size must be divisible by world_size * grad_accum_steps "
                     f"({per_step}); got {cfg.global_batch_size}, which DP's scatter would split "
                     f"unevenly as {sizes} per device and DDP cannot average exactly"))
    if cfg.model in MODEL_DATASETS and cfg.dataset not in MODEL_DATASETS[cfg.model]:
        errs.append(("dataset", f"dataset '{cfg.dataset}' does not fit model '{cfg.model}'; "
                                f"use one of {list(MODEL_DATASETS[cfg.model])}"))
    if cfg.model == "gpt" and cfg.width % cfg.n_head:
        errs.append(("n_head", f"width ({cfg.width}) must be divisible by n_head ({cfg.n_head})"))
    if cfg.nnodes > 1:
        if cfg.mode != "ddp":
            errs.append(("nnodes", "nnodes > 1 needs mode 'ddp' (DP is one process on one host)"))
        elif cfg.world_size % cfg.nnodes:
            errs.append(("nnodes", f"world_size ({cfg.world_size}) must be divisible by nnodes ({cfg.nnodes})"))
    if cfg.fault != "none":
        if cfg.fault_rank >= cfg.world_size:
            errs.append(("fault_rank", f"fault_rank must be < world_size ({cfg.world_size}) (got {cfg.fault_rank})"))
        if cfg.fault_step >= cfg.steps:
            errs.append(("fault_step", f"fault_step must be < steps ({cfg.steps}) (got {cfg.fault_step})"))
        if cfg.fault == "hang" and cfg.mode not in ("ddp", "fsdp"):
            errs.append(("fault", "fault 'hang' needs mode 'ddp' or 'fsdp': DP and single have no "
                                  "collective timeout, so the run would hang for good"))
        if cfg.device == "cuda" and (msg := dp_cuda_fault_error(cfg)):
            errs.append(("fault", msg))
    errs += _fsdp_errors(cfg)
    errs += _comm_hook_errors(cfg)
    if cfg.backend == "nccl" and cfg.device == "cpu":
        errs.append(("backend", "backend 'nccl' needs device 'cuda' (use 'gloo' on CPU)"))
    return errs


def dp_cuda_fault_error(cfg: RunConfig) -> str | None:
    """The rule for faults under DP on CUDA, or None when `cfg` keeps it: torch.nn.parallel's DP
    (engine/modes/dp/cuda.py) injects no fault, so a run asking for one is refused rather than run
    without it. Checked here for `device='cuda'` and by `engine.components.devices.resolve_plan`
    once `device='auto'` has picked CUDA."""
    if cfg.mode == "dp" and cfg.fault != "none":
        return (f"fault '{cfg.fault}' is not injected by DP on CUDA devices (torch.nn.parallel's "
                f"threads have no fault hook here); use device 'cpu' (emulated DP) or mode 'ddp', "
                f"or fault 'none'")
    return None


def _fsdp_errors(cfg: RunConfig) -> list[tuple[str, str]]:
    """FSDP knobs apply to mode 'fsdp' only; bf16 parameters and bf16 autocast do not mix."""
    errs: list[tuple[str, str]] = []
    if cfg.mode != "fsdp":
        if not cfg.reshard_after_forward:
            errs.append(("reshard_after_forward", f"reshard_after_forward=false needs mode 'fsdp' "
                                                  f"(got mode '{cfg.mode}')"))
        for name in ("fsdp_param_dtype", "fsdp_reduce_dtype"):
            if getattr(cfg, name) != "float32":
                errs.append((name, f"{name} '{getattr(cfg, name)}' needs mode 'fsdp' (got mode '{cfg.mode}')"))
    elif cfg.amp and cfg.fsdp_param_dtype == "bfloat16":
        errs.append(("amp", "amp (bf16 autocast) and fsdp_param_dtype 'bfloat16' both cast the compute "
                            "to bf16; use one (fsdp_param_dtype also halves the all-gather bytes)"))
    return errs


def _comm_hook_errors(cfg: RunConfig) -> list[tuple[str, str]]:
    """A comm hook is DDP's (DistributedDataParallel.register_comm_hook), runs with overlap on,
    bf16 needs NCCL; the PowerSGD knobs need comm_hook 'powersgd'. (A backend 'auto' that resolves
    to gloo is refused in pre-flight, `engine.modes.ddp.comm_hooks.check_comm_hook`.)"""
    errs: list[tuple[str, str]] = []
    if cfg.comm_hook != "none":
        if cfg.mode != "ddp":
            errs.append(("comm_hook", f"comm_hook '{cfg.comm_hook}' needs mode 'ddp' (DistributedDataParallel's "
                                      f"register_comm_hook; got mode '{cfg.mode}')"))
        if not cfg.overlap:
            errs.append(("overlap", f"overlap=false defers ddpviz's own all-reduces; comm_hook "
                                    f"'{cfg.comm_hook}' launches its collectives itself: use overlap=true"))
        if cfg.comm_hook == "bf16" and (cfg.backend == "gloo" or cfg.device == "cpu"):
            errs.append(("comm_hook", "comm_hook 'bf16' needs backend 'nccl' on CUDA: PyTorch refuses "
                                      "bf16_compress_hook on gloo; use 'fp16' or 'powersgd'"))
    if cfg.comm_hook != "powersgd":
        defaults = RunConfig.model_fields
        for name in ("matrix_approximation_rank", "start_powerSGD_iter"):
            if getattr(cfg, name) != defaults[name].default:
                errs.append((name, f"{name} needs comm_hook 'powersgd' (got comm_hook '{cfg.comm_hook}')"))
    return errs


def _scatter_sizes(batch: int, n: int) -> list[int]:
    """Chunk sizes of `torch.chunk(batch, n)`, which DP's scatter uses: ceil(batch/n) each."""
    size = -(-batch // n)
    out, left = [], batch
    while left > 0 and len(out) < n:
        out.append(min(size, left))
        left -= out[-1]
    return out


def _describe(err: dict[str, Any]) -> tuple[str, str]:
    field = ".".join(str(p) for p in err.get("loc", ())) or "config"
    kind, ctx, got = err.get("type", ""), err.get("ctx") or {}, err.get("input")
    rules = {
        "greater_than_equal": lambda: f"must be >= {ctx.get('ge')}",
        "greater_than": lambda: f"must be > {ctx.get('gt')}",
        "less_than_equal": lambda: f"must be <= {ctx.get('le')}",
        "less_than": lambda: f"must be < {ctx.get('lt')}",
        "literal_error": lambda: f"must be one of {ctx.get('expected')}",
        "extra_forbidden": lambda: "is not a known field",
        "missing": lambda: "is required",
        "finite_number": lambda: "must be a finite number",
        "string_too_long": lambda: f"must be at most {ctx.get('max_length')} characters",
        "string_too_short": lambda: f"must be at least {ctx.get('min_length')} characters",
    }
    if kind in rules:
        rule = rules[kind]()
    elif kind == "value_error":
        # cross-field rules arrive pre-formatted as "field: message | field: message"
        return field, str(ctx.get("error", err.get("msg", "")))
    else:
        rule = err.get("msg", "is invalid").lower()
    shown = repr(got)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return field, f"{field} {rule} (got {shown})"


def validate_config(data: dict[str, Any] | RunConfig, *, known_models: set[str] | None = None) -> RunConfig:
    """Validate a job spec.

    Args:
        data: field values (unknown fields are refused), or a RunConfig to re-check.
        known_models: model names allowed; default the built-ins plus installed plugins.

    Raises:
        ConfigError: listing every broken rule as ``(field, message)``.
    """
    if isinstance(data, RunConfig):
        data = data.model_dump()
    if not isinstance(data, dict):
        raise ConfigError([("config", f"config must be a JSON object (got {type(data).__name__})")])
    try:
        cfg = RunConfig(**data)
    except ValidationError as exc:
        errors: list[tuple[str, str]] = []
        for e in exc.errors():
            field, msg = _describe(e)
            if e.get("type") == "value_error":
                for part in msg.removeprefix("Value error, ").split(" | "):
                    f, _, m = part.partition(": ")
                    errors.append((f, m))
            else:
                errors.append((field, msg))
        raise ConfigError(errors) from None
    models = known_models if known_models is not None else set(BUILTIN_MODELS) | plugin_model_names()
    if cfg.model not in models:
        raise ConfigError([("model", f"model must be one of {sorted(models)} (got {cfg.model!r})")])
    return cfg


def plugin_model_names() -> set[str]:
    """Names registered under the `ddpviz.models` entry-point group (read without importing them)."""
    from importlib.metadata import entry_points

    return {ep.name for ep in entry_points(group="ddpviz.models")}
