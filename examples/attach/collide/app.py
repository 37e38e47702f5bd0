"""The script's own app module."""

NAME = "collide"


def banner(rank: int) -> str:
    return f"[{NAME}] rank {rank}"
