"""Voices the executors declare reach the daemon through the READY handshake (worker side, no processes)."""

from __future__ import annotations

from stagevisor.supervisor.worker.build import declared_voices


class Declares:
    voices = [{"id": "a", "language": "en", "sample_rate": 16000, "aliases": ["x"], "model": object()}]


class DeclaresGarbage:
    voices = ["not a dict"]


class Silent:
    pass


def test_declared_voices_are_collected_with_plain_values_only():
    assert declared_voices({"pre": Declares(), "engine": Silent()}) == [
        {"id": "a", "language": "en", "sample_rate": 16000, "aliases": ["x"]}
    ]


def test_a_malformed_declaration_is_ignored_not_fatal():
    assert declared_voices({"pre": DeclaresGarbage(), "other": Declares()}) == [
        {"id": "a", "language": "en", "sample_rate": 16000, "aliases": ["x"]}
    ]


class DeclaresOneGoodOneBad:
    voices = [{"id": "joe"}, "amy"]


def test_a_declaration_with_one_malformed_voice_is_ignored_whole_as_its_warning_says(caplog):
    assert declared_voices({"pre": DeclaresOneGoodOneBad()}) == []
    assert "stage 'pre' declares voices the daemon cannot use ('amy' is not a dict" in caplog.text
    assert "ignored" in caplog.text
