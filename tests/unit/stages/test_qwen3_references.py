"""The cache of encoded reference voices (stages/qwen3/references.py), with stand-in encoders."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.qwen3  # imports torch


class Encoders:
    def __init__(self) -> None:
        self.embedded: list[bytes] = []
        self.encoded: list[bytes] = []

    def get(self, cache, wav: bytes, in_context: bool = False):
        def embed():
            self.embedded.append(wav)
            return f"embedding of {wav!r}"

        def encode():
            self.encoded.append(wav)
            return f"codes of {wav!r}"

        return cache.encoded(wav, in_context, embed, encode)


def test_a_kept_voice_is_not_encoded_again_and_its_codes_are_added_when_first_needed():
    from stagevisor.stages.qwen3.references import ReferenceCache

    cache, encoders = ReferenceCache(4), Encoders()
    first = encoders.get(cache, b"a")
    assert first.codes is None
    assert encoders.get(cache, b"a") is first
    with_codes = encoders.get(cache, b"a", in_context=True)
    assert with_codes.speaker_embedding == first.speaker_embedding and with_codes.codes == "codes of b'a'"
    assert encoders.get(cache, b"a") is with_codes  # the entry with codes replaced the one without
    assert encoders.embedded == [b"a"] and encoders.encoded == [b"a"]


def test_the_least_recently_used_voice_goes_first():
    from stagevisor.stages.qwen3.references import ReferenceCache

    cache, encoders = ReferenceCache(2), Encoders()
    for wav in (b"a", b"b", b"a", b"c"):  # b is the least recently used when c comes
        encoders.get(cache, wav)
    assert len(cache) == 2
    encoders.get(cache, b"a")
    encoders.get(cache, b"b")
    assert encoders.embedded == [b"a", b"b", b"c", b"b"]


def test_no_voice_is_kept_at_capacity_zero_and_a_negative_one_is_refused():
    from stagevisor.stages.qwen3.references import ReferenceCache

    cache, encoders = ReferenceCache(0), Encoders()
    encoders.get(cache, b"a")
    encoders.get(cache, b"a")
    assert encoders.embedded == [b"a", b"a"] and len(cache) == 0
    with pytest.raises(ValueError, match="cached_references must be >= 0"):
        ReferenceCache(-1)


def test_an_entry_with_codes_is_not_replaced_by_one_without_made_meanwhile():
    """A request encodes a new voice's speaker vector while another, in context, keeps the same voice with codes:
    the kept entry keeps its codes."""
    from stagevisor.stages.qwen3.references import ReferenceCache

    cache, encoders = ReferenceCache(4), Encoders()

    def embed():
        encoders.get(cache, b"a", in_context=True)  # the other request, done while this one encodes
        return "embedding of b'a'"

    cache.encoded(b"a", False, embed, lambda: "unused")
    assert encoders.get(cache, b"a", in_context=True).codes == "codes of b'a'"
    assert encoders.encoded == [b"a"]


def test_an_encoded_reference_cannot_be_changed():
    import dataclasses

    from stagevisor.stages.qwen3.references import EncodedReference

    with pytest.raises(dataclasses.FrozenInstanceError):
        EncodedReference("embedding").codes = "codes"  # type: ignore[misc]


@pytest.mark.parametrize(("kind", "warmed"), [("base", 1), ("custom_voice", 0), ("voice_design", 0)])
def test_a_checkpoint_that_clones_warms_librosas_resampler_when_its_preprocessing_is_built(monkeypatch, kind, warmed):
    """The first clone after a worker (re)start spent about 1 s loading librosa's resampling backend."""
    from pathlib import Path

    import librosa

    from stagevisor.stages.qwen3.checkpoint import Checkpoint
    from stagevisor.stages.qwen3.executors import Preprocessing

    calls = []
    monkeypatch.setattr(librosa, "resample", lambda **kwargs: calls.append(kwargs))
    Preprocessing(Checkpoint(Path("/ckpt"), kind, "0b6", ("ryan",) if kind == "custom_voice" else (), ("english",)))
    assert len(calls) == warmed
