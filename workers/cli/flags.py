"""Command-line flags for every `RunConfig` field, generated so none is forgotten.

Field ``global_batch_size`` becomes ``--global-batch-size``; booleans get ``--overlap`` and
``--no-overlap``. Flags default to "not given", so only fields the user set reach the config and
`engine.config.validate_config` (not argparse) judges values, with messages naming the field.
"""

from __future__ import annotations

import argparse
import typing
from typing import Any

from ddpviz.engine.config import RunConfig


def flag_name(field: str) -> str:
    """``world_size`` → ``--world-size``."""
    return "--" + field.replace("_", "-")


def _describe(name: str, info: Any) -> tuple[dict[str, Any], str]:
    """argparse kwargs and help text for one field."""
    annotation = info.annotation
    choices = typing.get_args(annotation) if typing.get_origin(annotation) is typing.Literal else ()
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}, f"default: {info.default}"
    kind = int if annotation is int else float if annotation is float else str
    text = f"default: {info.default}"
    if choices:
        text = f"one of {', '.join(map(str, choices))}; {text}"
    rules = [f"{k} {getattr(m, k)}" for m in info.metadata for k in ("ge", "gt", "le", "lt")
             if getattr(m, k, None) is not None]
    if rules:
        text += f"; {', '.join(rules)}"
    return {"type": kind, "metavar": name.upper() if not choices else "{" + ",".join(choices) + "}"}, text


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """Add one flag per RunConfig field to `parser` (in a "run settings" group)."""
    group = parser.add_argument_group("run settings (RunConfig; see docs)")
    for name, info in RunConfig.model_fields.items():
        kwargs, text = _describe(name, info)
        group.add_argument(flag_name(name), dest=f"cfg_{name}", default=argparse.SUPPRESS,
                           help=text.replace("%", "%%"), **kwargs)


def run_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The RunConfig fields the user set on the command line, by field name."""
    return {name: getattr(args, f"cfg_{name}") for name in RunConfig.model_fields
            if hasattr(args, f"cfg_{name}")}
