"""``python -m workers ...`` is the ``ddpviz`` command."""

from workers.cli.commands import main

if __name__ == "__main__":
    main()
