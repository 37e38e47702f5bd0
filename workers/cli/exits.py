"""Exit codes of every `ddpviz` command: 0 done, 1 failed, 2 refused (bad input, before anything ran)."""

EXIT_OK, EXIT_FAILED, EXIT_REFUSED = 0, 1, 2
