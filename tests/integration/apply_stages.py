"""A factory that raises, for the refused-apply test: the new topology's worker cannot build its stage."""


def broken(**kwargs: object) -> None:
    raise RuntimeError("this factory raises on purpose")
