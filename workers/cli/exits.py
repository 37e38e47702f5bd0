"""Exit codes of every `ddpviz` command: 0 done, 1 failed, 2 refused (bad input, before anything ran); and the
words of the failure several commands share (`no_run`)."""

EXIT_OK, EXIT_FAILED, EXIT_REFUSED = 0, 1, 2


def no_run(run_id: str, url: str | None) -> str:
    """"no run 'ID' in the Redis at URL (where that URL came from)": a missing run names the Redis asked
    (`workers.connection.url_and_source`; a user whose `ddpviz up` was not found read only "no run")."""
    from ddpviz.workers.connection import redact, url_and_source

    used, source = url_and_source(url)
    return f"no run {run_id!r} in the Redis at {redact(used)} ({source})"
