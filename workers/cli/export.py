"""`ddpviz export`: a run's events as JSON lines, its steps as CSV, or a Chrome trace.

File names and formats are `engine.export.EXPORT_FORMATS`'s (the app's downloads use the same).
"""

from __future__ import annotations

import argparse
import sys

from ddpviz.workers.cli.exits import EXIT_FAILED, EXIT_OK, EXIT_REFUSED, no_run


def cmd_export(args: argparse.Namespace) -> int:
    """Write the run's events as JSON lines (or its steps as CSV, or a Chrome trace), oldest
    first; with --dir, to ``DIR/<run_id><suffix>`` and never outside DIR
    (`engine.export.export_path`)."""
    from ddpviz.engine.export import EXPORT_FORMATS, SAFE_ID, export_path, render

    if not SAFE_ID.match(args.run_id):
        _err(f"refused: run_id must be 1-64 letters, digits, '-' or '_' (got {args.run_id[:80]!r})")
        return EXIT_REFUSED
    path = export_path(args.dir, args.run_id, EXPORT_FORMATS[args.format].suffix) if args.dir else args.out
    from ddpviz.workers.client import cli_client
    from ddpviz.workers.history import read_history
    from ddpviz.workers.sink import DEFAULT_STREAM_MAXLEN

    client = cli_client(args.url)
    if client.get_run(args.run_id) is None:
        _err(no_run(args.run_id, args.url))
        return EXIT_FAILED
    events, cut = read_history(client, args.run_id)
    if cut is not None:  # said on stderr whether the export goes to a file or stdout
        _err(f"warning: run {args.run_id}'s event stream keeps its newest {DEFAULT_STREAM_MAXLEN:,} events: steps "
             f"0-{cut - 1} were trimmed from it, so this export starts at step {cut} (its run_started comes from the "
             "run's record; its summary was computed over every step)")
    text = render(events, args.format)
    if path is None:
        sys.stdout.write(text)
        return EXIT_OK
    try:
        if args.dir:
            path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:  # a clear line, not a traceback (a new user's --out /nonexistent/x.jsonl, 2026-12-06)
        _err(f"refused: --{'dir' if args.dir else 'out'}: cannot write {path}: {exc.strerror or exc}")
        return EXIT_REFUSED
    print(f"{len(events)} events of run {args.run_id} read; written as {args.format} to {path}", file=sys.stderr)
    return EXIT_OK



def _err(message: str) -> None:
    print(f"ddpviz: {message}", file=sys.stderr, flush=True)
