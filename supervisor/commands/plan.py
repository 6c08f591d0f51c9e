"""Placeholder until its issue lands; replaced wholesale."""


def register(subparsers) -> None:
    return None
