"""Importing qwen-tts quietly (stages/qwen3/package.py): what it prints goes, the rest of standard error stays."""

from __future__ import annotations

import logging
import os

from stagevisor.stages.qwen3.package import quietly


def test_the_shells_line_about_sox_and_printed_banners_go_and_everything_else_on_stderr_is_kept(capfd, caplog):
    with caplog.at_level(logging.DEBUG, logger="stagevisor.stages.qwen3.package"):
        with quietly():
            print("Warning: flash-attn is not installed.")
            os.write(2, b"/bin/sh: 1: sox: not found\nsomething else went wrong\n")
            os.write(2, b"sh: sox: command not found\n")
            logging.getLogger("sox").warning("SoX could not be found!")
            logging.getLogger("sox").error("sox failed")
        os.write(2, b"after\n")
    out, err = capfd.readouterr()
    assert out == ""
    assert err == "something else went wrong\nafter\n"
    messages = [(r.name, r.getMessage()) for r in caplog.records]
    assert ("sox", "SoX could not be found!") not in messages and ("sox", "sox failed") in messages
    assert ("stagevisor.stages.qwen3.package", "importing qwen_tts printed: Warning: flash-attn is not installed.") in (
        messages
    )
