"""Importing qwen-tts without the alarms it raises about parts of it stagevisor never runs.

`import qwen_tts` imports its 25 Hz speech tokenizer too, which stagevisor
does not serve (checkpoint.py refuses 25 Hz checkpoints). That import prints
a flash-attn banner to standard output, and imports `sox`, which runs
`sox -h` through a shell: on a host without SoX the shell writes `sox: not
found` to the worker's standard error and `sox` logs a multi-line warning.
Loading a checkpoint then logs, at INFO, that talker_config and the other
sub-configs are None and "initialized with default values" (transformers
builds a default config to compare against), which reads as if the
checkpoint's own config were ignored. None of it is true of what is served;
each worker start would repeat it in the operator's log.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import threading
from typing import Any, Iterator

log = logging.getLogger(__name__)
QUIET_LOGGER = "qwen_tts"
"""Held at WARNING unless the operator asked for DEBUG: its INFO lines are the config's "default values"."""

_lock = threading.Lock()
_imported = False


def _popen_without_stderr(command: str, mode: str = "r", buffering: int = -1) -> Any:
    """os.popen for reading a command's output with its standard error discarded (sox's `sox -h` probe)."""
    if mode != "r":
        return _popen(command, mode, buffering)
    done = subprocess.run(command, shell=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return io.StringIO(done.stdout)


_popen = os.popen


def _below_error(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR


@contextlib.contextmanager
def _quietly() -> Iterator[None]:
    printed = io.StringIO()
    sox = logging.getLogger("sox")
    # A filter, not a level: sox sets its logger's level as it is imported.
    sox.addFilter(_below_error)
    # Only for the import, under _lock: no other code of this process calls os.popen while a stage is built.
    os.popen = _popen_without_stderr
    try:
        with contextlib.redirect_stdout(printed):
            yield
    finally:
        os.popen = _popen
        sox.removeFilter(_below_error)
        if printed.getvalue().strip():
            log.debug("importing qwen_tts printed: %s", " ".join(printed.getvalue().split()))


def import_qwen_tts() -> None:
    """Import qwen_tts once in this process, quietly (see the module docstring); later imports of it are free."""
    global _imported
    with _lock:
        if _imported:
            return
        if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
            logging.getLogger(QUIET_LOGGER).setLevel(logging.WARNING)
        with _quietly():
            import qwen_tts  # noqa: F401  # the import is what is quieted
        _imported = True
