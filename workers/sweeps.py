"""Sets of runs launched together: a single/DP/DDP/FSDP set and parameter sweeps. Imports no torch.

Every run of a set shares one `group` in its record (the set's id) and gets a label naming what
differs, so the app can find a set by its group and draw it without extra Redis keys.

Sweep kinds (`SWEEP_KINDS`):

- ``world_size``: for each world size n, a DP run and a DDP run on n devices, plus one `single`
  run — the baseline of scaling efficiency ``samples_per_s(n) / (n · samples_per_s(single))``.
- ``bucket_cap_mb``: a DDP run per bucket cap (MiB), for step time vs bucket size.
- ``overlap``: two DDP runs, all-reduce overlapping backward on and off.
- ``shape``: for each model shape (width, depth), a DP run and a DDP run: a narrow deep model
  spends its step in Python per layer (DP's device threads then queue for the GIL), a wide
  shallow one in large kernels that release it; the page sets the measured GIL share beside the
  DDP ÷ DP throughput ratio.

Example:
    >>> sweep_id = submit_sweep(client, {"steps": 30}, "world_size", [1, 2, 4])
    >>> [r["label"] for r in sweep_runs(client, sweep_id)]
    ['single', 'DP ×1', 'DDP ×1', 'DP ×2', 'DDP ×2', 'DP ×4', 'DDP ×4']
"""

from __future__ import annotations

import uuid
from typing import Any, Iterable

from ddpviz.engine.config import COMM_HOOK_FIELDS, FSDP_FIELDS, ConfigError, validate_config

SWEEP_KINDS = ("world_size", "bucket_cap_mb", "overlap", "shape")
SWEEP_PREFIX = "sweep-"
TRIO_PREFIX = "trio-"
MAX_SWEEP_RUNS = 32  # one click must not flood the queue


def _new_id(prefix: str, kind: str = "") -> str:
    short = {"world_size": "ws", "bucket_cap_mb": "bucket", "overlap": "overlap", "shape": "shape"}.get(kind, kind)
    return f"{prefix}{short + '-' if short else ''}{uuid.uuid4().hex[:10]}"


def sweep_kind(group: str | None) -> str | None:
    """The kind of the sweep whose id is `group` (None if it is not a sweep id)."""
    if not group or not group.startswith(SWEEP_PREFIX):
        return None
    short = group[len(SWEEP_PREFIX):].split("-", 1)[0]
    return {"ws": "world_size", "bucket": "bucket_cap_mb", "overlap": "overlap", "shape": "shape"}.get(short)


TRIO_MODES = ("single", "dp", "ddp", "fsdp")  # the Compare set: one device and the three strategies
MEMBER_NAMES = {"single": "single", "dp": "DP", "ddp": "DDP", "fsdp": "FSDP"}  # a mode as labels name it


def member_label(label: str | None, member: str) -> str:
    """Label of one run of a pair or set: ``"X · DP"`` for a set labelled X, else the member's
    own name ("DP", "DDP", "single", "FSDP")."""
    label = (label or "").strip()
    return f"{label} · {member}" if label else member


def trio_configs(config: dict[str, Any], label: str | None = None) -> list[tuple[dict[str, Any], str]]:
    """(config, label) of the single, DP, DDP and FSDP runs of `config` (its `mode` is ignored;
    the FSDP-only fields reach the FSDP run only, the comm hook fields the DDP run only); with a
    `label` X the runs are "X · single", "X · DP", "X · DDP", "X · FSDP"."""
    only = {"fsdp": FSDP_FIELDS, "ddp": COMM_HOOK_FIELDS}
    return [({**{k: v for k, v in config.items() if not any(k in f for o, f in only.items() if o != m)},
              "mode": m}, member_label(label, MEMBER_NAMES[m])) for m in TRIO_MODES]


def sweep_configs(base: dict[str, Any], kind: str,
                  values: Iterable[Any]) -> list[tuple[dict[str, Any], str]]:
    """(config, label) of every run a sweep submits, in submission order.

    Raises:
        ValueError: unknown `kind`, no values, or more than `MAX_SWEEP_RUNS` runs.
    """
    values = list(dict.fromkeys(values))  # order kept, duplicates dropped
    if kind not in SWEEP_KINDS:
        raise ValueError(f"kind must be one of {list(SWEEP_KINDS)} (got {kind!r})")
    if not values:
        raise ValueError("values must not be empty")
    if kind == "world_size":
        sizes = sorted(int(v) for v in values)
        out = [({**base, "mode": "single", "world_size": 1}, "single")]
        for n in sizes:
            out += [({**base, "mode": "dp", "world_size": n}, f"DP ×{n}"),
                    ({**base, "mode": "ddp", "world_size": n}, f"DDP ×{n}")]
    elif kind == "shape":  # values: (width, depth) pairs
        out = []
        for w, d in (parse_shape(v) for v in values):
            out += [({**base, "mode": m, "width": w, "depth": d}, f"{name} {w}×{d}")
                    for m, name in (("dp", "DP"), ("ddp", "DDP"))]
    elif kind == "bucket_cap_mb":
        out = [({**base, "mode": "ddp", "bucket_cap_mb": float(v)}, f"DDP cap {float(v):g} MiB")
               for v in sorted(float(v) for v in values)]
    else:
        flags = [bool(v) for v in values]
        out = [({**base, "mode": "ddp", "overlap": f}, f"DDP overlap {'on' if f else 'off'}")
               for f in sorted(set(flags), reverse=True)]
    if len(out) > MAX_SWEEP_RUNS:
        raise ValueError(f"a sweep may submit at most {MAX_SWEEP_RUNS} runs (got {len(out)})")
    return out


def parse_shape(value: Any) -> tuple[int, int]:
    """(width, depth) from a pair or a string "WxD" (also "W×D").

    Raises:
        ValueError: not two whole numbers >= 1.
    """
    if isinstance(value, str):
        parts = value.lower().replace("×", "x").split("x")
    else:
        parts = list(value)
    try:
        w, d = (int(str(p).strip()) for p in parts)
    except ValueError:
        raise ValueError(f"a shape is WIDTHxDEPTH, two whole numbers (got {value!r})") from None
    if w < 1 or d < 1:
        raise ValueError(f"a shape's width and depth must be >= 1 (got {value!r})")
    return w, d


def _validate_all(items: list[tuple[dict[str, Any], str]]) -> None:
    """Validate every config before any is submitted; errors name the run's label."""
    errors: list[tuple[str, str]] = []
    for cfg, label in items:
        try:
            validate_config(cfg)
        except ConfigError as exc:
            errors += [(field, f"{label}: {msg}") for field, msg in exc.errors]
    if errors:
        raise ConfigError(errors)


def _submit_set(client, items: list[tuple[dict[str, Any], str]], group: str) -> list[str]:
    _validate_all(items)
    return [client.submit(cfg, label=label, group=group) for cfg, label in items]


def submit_trio(client, config: dict[str, Any], label: str | None = None) -> tuple[str, dict[str, str]]:
    """Submit `config` as single, DP, DDP and FSDP (one group), labelled as `trio_configs` says.
    Returns (group, {mode: run_id}).

    Raises:
        engine.config.ConfigError: a variant breaks a rule (nothing is submitted then).
    """
    group = _new_id(TRIO_PREFIX)
    ids = _submit_set(client, trio_configs(config, label), group)
    return group, dict(zip(TRIO_MODES, ids))


def submit_sweep(client, base_config: dict[str, Any], kind: str, values: Iterable[Any]) -> str:
    """Submit a sweep of `base_config` over `values` of `kind` (see module docstring).

    Returns:
        The sweep id (``sweep-<kind>-<hex>``), which is every run's `group`.

    Raises:
        ValueError: see `sweep_configs`.
        engine.config.ConfigError: some run's config breaks a rule (e.g. global_batch_size not
            divisible by a world size); nothing is submitted then.
    """
    items = sweep_configs(base_config, kind, values)
    sweep_id = _new_id(SWEEP_PREFIX, kind)
    _submit_set(client, items, sweep_id)
    return sweep_id


def sweep_runs(client, sweep_id: str, limit: int = 1000) -> list[dict[str, Any]]:
    """The run records of a sweep (or any group), oldest first."""
    runs = [r for r in client.list_runs(limit=limit) if r.get("group") == sweep_id]
    return sorted(runs, key=lambda r: r.get("created_at") or 0)


def list_sweeps(client, limit: int = 1000) -> dict[str, list[dict[str, Any]]]:
    """Sweep id -> its runs (oldest first), newest sweep first, among the `limit` newest runs."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in client.list_runs(limit=limit):  # newest first
        if sweep_kind(r.get("group")):
            out.setdefault(r["group"], []).append(r)
    return {g: sorted(rs, key=lambda r: r.get("created_at") or 0) for g, rs in out.items()}
