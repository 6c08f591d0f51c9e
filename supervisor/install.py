"""Where this stagevisor runs from (a source checkout or an installed wheel), and so the pip command that adds an
extra here: the advice every missing-dependency message ends with."""

from __future__ import annotations

import os
from pathlib import Path


def checkout_root() -> Path | None:
    """The source checkout this code runs from (its pyproject.toml beside supervisor/), or None when installed."""
    root = Path(__file__).resolve().parents[1]
    if (root / "pyproject.toml").is_file() and (root / "supervisor" / "install.py").is_file():
        return root
    return None


def install_command(extra: str) -> str:
    """The pip command that adds the optional `extra` to this installation, true where it is printed.

    stagevisor is not on a package index: in a checkout (an editable install or the
    source tree on PYTHONPATH) the extra comes from that checkout, named `.` when it is
    the working directory; an installed wheel is named by its distribution.
    """
    root = checkout_root()
    if root is None:
        return f"pip install 'stagevisor[{extra}]'"
    try:
        here = Path(os.getcwd()).resolve()
    except OSError:  # the working directory was removed
        here = None
    where = "." if here == root else str(root)
    return f"pip install -e '{where}[{extra}]'"
