"""``python -m ddpviz.workers ...`` is the ``ddpviz`` command."""

from ddpviz.workers.cli.commands import main

if __name__ == "__main__":
    main()
