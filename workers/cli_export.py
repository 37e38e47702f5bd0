"""`ddpviz export`: a run's events as JSON lines, its steps as CSV, or a Chrome trace.

Its own module so that `workers.doctor` can call it without importing the CLI (no import cycle).
"""

from __future__ import annotations

import argparse
import json
import sys

from workers.exits import EXIT_FAILED, EXIT_OK, EXIT_REFUSED

EXPORT_SUFFIX = {"jsonl": ".jsonl", "csv": ".steps.csv", "trace": ".trace.json"}


def cmd_export(args: argparse.Namespace) -> int:
    """Write the run's events as JSON lines (or its steps as CSV, or a Chrome trace), oldest
    first; with --dir, to ``DIR/<run_id><suffix>`` and never outside DIR
    (`engine.export.export_path`)."""
    from engine.export import SAFE_ID, chrome_trace, export_path, steps_csv, to_jsonl

    if not SAFE_ID.match(args.run_id):
        _err(f"refused: run_id must be 1-64 letters, digits, '-' or '_' (got {args.run_id[:80]!r})")
        return EXIT_REFUSED
    path = export_path(args.dir, args.run_id, EXPORT_SUFFIX[args.format]) if args.dir else args.out
    from workers.client import DdpvizClient

    client = DdpvizClient(url=args.url)
    if client.get_run(args.run_id) is None:
        _err(f"no run {args.run_id!r}")
        return EXIT_FAILED
    events, after = [], "0-0"
    while True:
        batch, after = client.read_events(args.run_id, after, count=2000)
        if not batch:
            break
        events += batch
    text = (to_jsonl(events) if args.format == "jsonl" else steps_csv(events)
            if args.format == "csv" else json.dumps(chrome_trace(events)))
    if path is None:
        sys.stdout.write(text)
        return EXIT_OK
    if args.dir:
        path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    print(f"{len(events)} events -> {path}", file=sys.stderr)
    return EXIT_OK



def _err(message: str) -> None:
    print(f"ddpviz: {message}", file=sys.stderr, flush=True)
