"""``python -m workers ...`` is the ``ddpviz`` command."""

from workers.cli import main

if __name__ == "__main__":
    main()
