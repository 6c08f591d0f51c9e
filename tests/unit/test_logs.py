"""Repeated log lines are rate-limited per kind, and each distinct traceback is printed once."""

from __future__ import annotations

import io
import logging

from stagevisor.supervisor.logs import (
    MAX_MESSAGE_CHARS,
    MAX_TRACEBACK_CHARS,
    SUMMARY_CHARS,
    RepeatFilter,
    bounded_traceback,
    promised,
)
from tests.fakes import FakeClock


def logger_with_filter(clock: FakeClock) -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    handler.addFilter(RepeatFilter(burst=3, period=10.0, clock=clock))
    logger = logging.getLogger(f"test.logs.{id(stream)}")
    logger.propagate = False
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)
    return logger, stream


def link_broke(logger: logging.Logger, n: int) -> None:
    logger.info("data-plane link to %s broke for request %s: %s", "unix:/run/g1.sock", f"{n:032x}", "refused")


def test_a_flood_of_one_kind_of_line_is_cut_to_the_burst_then_the_count_is_reported():
    clock = FakeClock(0.0)
    logger, stream = logger_with_filter(clock)
    for n in range(1000):
        link_broke(logger, n)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3
    assert "limited to 3 per 10s" in lines[-1]
    clock.now = 10.5
    link_broke(logger, 1000)
    assert stream.getvalue().splitlines()[-1].endswith("[997 similar messages suppressed in the previous 10s]")


def transition(logger: logging.Logger, group: str, pid: int) -> None:
    logger.info("group %r: %s -> %s pid %d", group, "STARTING", "READY", pid)


def test_one_line_for_many_groups_is_not_a_repeat_but_one_group_crash_looping_is():
    logger, stream = logger_with_filter(FakeClock(0.0))
    for n in range(12):
        transition(logger, f"group{chr(ord('a') + n)}", 100 + n)
    assert len(stream.getvalue().splitlines()) == 12
    for pid in range(200, 220):
        transition(logger, "vocoder", pid)
    assert len(stream.getvalue().splitlines()) == 12 + 3


def test_other_kinds_of_lines_are_not_held_back_by_a_flood():
    logger, stream = logger_with_filter(FakeClock(0.0))
    for _ in range(100):
        logger.info("%s", "request x failed")
    logger.info("%s", "group 'vocoder' FAILED")  # same template, another call site
    logger.warning("group %r FAILED", "vocoder")
    assert stream.getvalue().splitlines()[-2:] == ["INFO group 'vocoder' FAILED", "WARNING group 'vocoder' FAILED"]


def fail(secret: str) -> None:
    raise RuntimeError(f"token={secret}")


def test_a_traceback_is_printed_once_per_distinct_failure():
    logger, stream = logger_with_filter(FakeClock(0.0))
    for n in range(3):
        try:
            fail(str(n))
        except RuntimeError:
            logger.warning("stage %r failed request %s", "engine", n, exc_info=True)
    try:
        int("x")
    except ValueError:
        logger.error("another failure", exc_info=True)
    text = stream.getvalue()
    assert text.count("Traceback (most recent call last)") == 2
    assert "RuntimeError: token=1; traceback as logged before, seen 2 times" in text
    assert "ValueError: invalid literal" in text


def test_a_line_whose_request_id_a_client_was_given_is_never_dropped_and_its_traceback_printed_once():
    """
    1. a stage fails 1000 requests in one window; each client was told "the daemon log has the details
       (request <id>)";
    2. every id is in the log, each on one line, the first few with the whole message, the rest cut to a summary;
    3. the traceback is printed once, and other kinds of line are still limited to the burst.
    """
    logger, stream = logger_with_filter(FakeClock(0.0))
    ids = [f"{n:032x}" for n in range(1000)]
    for request_id in ids:
        try:
            fail("x" * 2000)
        except RuntimeError:
            logger.warning(
                "request %s failed in stage %r (RuntimeError)",
                request_id,
                "engine",
                exc_info=True,
                extra=promised(request_id),
            )
        link_broke(logger, int(request_id, 16))
    text = stream.getvalue()
    lines = [line for line in text.splitlines() if "failed in stage" in line]
    assert [line.split()[2] for line in lines] == ids
    assert text.count("Traceback (most recent call last)") == 1
    assert all(len(line) < SUMMARY_CHARS + 100 for line in lines[3:]) and "x" * 1000 in text
    assert text.count("data-plane link to") == 3


def test_a_huge_message_is_cut():
    logger, stream = logger_with_filter(FakeClock(0.0))
    logger.info("value %s", "x" * 100_000)
    assert len(stream.getvalue()) < 5000 and "characters cut" in stream.getvalue()


def test_one_rate_window_passes_a_burst_per_period_and_reports_what_it_refused_when_the_next_opens():
    from stagevisor.supervisor.logs import RateWindow

    window = RateWindow(burst=2, period=10.0)
    assert [window.admit(t)[0] for t in (0.0, 1.0, 2.0, 9.9)] == [True, True, False, False]
    assert window.admit(10.0) == (True, 2, 10.0)  # a new window: 2 refused in the last, which ran 10 s
    assert window.admit(11.0) == (True, 0, 0.0)


def test_an_exception_whose_text_holds_a_megabyte_is_logged_as_its_frames_and_a_cut_message():
    """Before: the first traceback of each failure was written whole, a 1 MB exception text and all."""
    logger, stream = logger_with_filter(FakeClock(0.0))
    for payload in ("x" * 1_000_000, "line\n" * 200_000):
        try:
            fail(payload)
        except RuntimeError:
            logger.warning("stage %r failed request %s", "engine", payload[:3], exc_info=True)
    text = stream.getvalue()
    assert len(text) < 2 * (MAX_TRACEBACK_CHARS + 1000)
    assert text.count("Traceback (most recent call last)") == 1  # the second is the same failure: summarised
    assert "in fail" in text and "RuntimeError: token=xxxx" in text
    last_line = "RuntimeError: token=" + "x" * 1_000_000
    assert f"[{len(last_line) - MAX_MESSAGE_CHARS} characters cut]" in text


def test_a_long_multi_line_traceback_keeps_its_first_frames_and_its_final_exception():
    text = "Traceback (most recent call last):\n" + "frame\n" * 10_000 + "ValueError: the end"
    cut = bounded_traceback(text, limit=1000)
    assert cut.startswith("Traceback (most recent call last):") and cut.endswith("ValueError: the end")
    assert len(cut) < 1100 and "characters of traceback cut" in cut
    assert bounded_traceback("short\ntext") == "short\ntext"


def test_a_renamed_worker_writes_its_new_name_in_every_later_line(monkeypatch):
    """A worker a scale renamed (`vocoder/0` -> `vocoder`) went on logging `[vocoder/0 pid N]`."""
    import sys

    from stagevisor.supervisor import logs

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    logs.configure("INFO", "vocoder/0 pid 7")
    logging.getLogger("stagevisor.worker").info("before")
    logs.rename("vocoder pid 7")
    logging.getLogger("stagevisor.worker").info("after")
    before, after = stream.getvalue().splitlines()
    assert "[vocoder/0 pid 7] stagevisor.worker: before" in before
    assert "[vocoder pid 7] stagevisor.worker: after" in after
