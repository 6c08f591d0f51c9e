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
import re
import sys
import tempfile
import threading
from typing import Iterator

log = logging.getLogger(__name__)
QUIET_LOGGER = "qwen_tts"
"""Held at WARNING unless the operator asked for DEBUG: its INFO lines are the config's "default values"."""
SOX_MISSING = re.compile(r"\bsox: (command )?not found")
"""The shell's line for sox's `sox -h` probe on a host without SoX (dash: `/bin/sh: 1: sox: not found`)."""

_lock = threading.Lock()
_imported = False


def _errors_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR


@contextlib.contextmanager
def quietly() -> Iterator[None]:
    """Standard output to a DEBUG line; standard error, the process's file descriptor 2 (where the probe's shell
    writes), held in a file and written back once done, less the shell's line about SoX. Nothing is patched."""
    printed = io.StringIO()
    sox = logging.getLogger("sox")
    # A filter, not a level: sox sets its logger's level as it is imported.
    sox.addFilter(_errors_only)
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            with contextlib.redirect_stdout(printed):
                yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sox.removeFilter(_errors_only)
            held.seek(0)
            kept = [
                line
                for line in held.read().splitlines(keepends=True)
                if not SOX_MISSING.search(line.decode(errors="replace"))
            ]
            if kept:
                os.write(2, b"".join(kept))
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
        with quietly():
            import qwen_tts  # noqa: F401  # the import is what is quieted
        _imported = True
