"""The optimized-graph cache a restarted worker loads its voice from: same audio, reused, never half-read."""

from __future__ import annotations

import pytest
import numpy as np

from stagevisor.stages.piper import graphs as G, voice as V
from stagevisor.stages.piper.options import SynthesisOptions
from stagevisor.stages.piper.sessions import cache_key
from stagevisor.supervisor import envs

# the quick subset (-m 'not slow', docs/testing.md) leaves this file out: the voice or hypothesis, minutes under load
pytestmark = pytest.mark.slow


def speak(voice: V.Voice) -> np.ndarray:
    ids = voice.phoneme_ids("A restarted worker speaks the same.")[0]
    return voice.decode(voice.acoustic(ids, SynthesisOptions(noise_scale=0.0, noise_w=0.0, length_scale=1.0)))


def test_a_voice_built_from_the_cached_optimized_graphs_speaks_bit_identical_audio(tmp_path, monkeypatch):
    """
    1. the first voice optimizes its graphs and saves them in the cache directory (no partial file left);
    2. a second voice loads them from there (its sessions come from the saved files);
    3. both speak the same bytes as a voice built without any cache.
    """
    model, config = V.embedded_voice_paths()
    plain = speak(V.Voice(model, config))
    monkeypatch.setenv(envs.CACHE_DIR.name, str(tmp_path))
    first = speak(V.Voice(model, config))
    saved = sorted(p.name for p in tmp_path.iterdir())
    assert [name.split("-")[0] for name in saved] == ["decoder", "flow", "prior"]
    stamps = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    second = V.Voice(model, config)
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == stamps  # reused, not rewritten
    assert np.array_equal(plain, first) and np.array_equal(plain, speak(second))


def test_a_damaged_cache_file_is_rebuilt(tmp_path, monkeypatch):
    model, config = V.embedded_voice_paths()
    monkeypatch.setenv(envs.CACHE_DIR.name, str(tmp_path))
    key = cache_key(model)
    (tmp_path / f"prior-{key}.onnx").write_bytes(b"not a graph")
    voice = V.Voice(model, config)
    assert speak(voice).size > 0
    assert (tmp_path / f"prior-{key}.onnx").stat().st_size > 1000


def test_with_every_graph_cached_the_voice_graph_is_not_cut_unless_a_file_is_damaged(tmp_path, monkeypatch):
    """
    1. a first voice saves its optimized graphs (prior, flow, decoder);
    2. a second one (as a spawned worker: no fork server's copy of the cut graphs) loads them from the
       cache without cutting the voice graph, finds the inputs' names there, and speaks the same bytes;
    3. with the flow's file damaged, the graph is cut after all and the file rebuilt.
    """
    model, config = V.embedded_voice_paths()
    monkeypatch.setenv(envs.CACHE_DIR.name, str(tmp_path))
    first = V.Voice(model, config)
    cuts = []
    real_split = V.split_graphs.__wrapped__

    def counted_split(path: str):
        cuts.append(path)
        return real_split(path)

    # The voice cuts the graph itself (no cached file) or through graphs.split_part (a damaged one).
    monkeypatch.setattr(V, "split_graphs", counted_split)
    monkeypatch.setattr(G, "split_graphs", counted_split)
    second = V.Voice(model, config)
    assert cuts == []
    assert second._latent_name == first._latent_name and second._flow_inputs == first._flow_inputs
    assert np.array_equal(speak(first), speak(second))
    key = cache_key(model)
    (tmp_path / f"flow-{key}.onnx").write_bytes(b"not a graph")
    third = V.Voice(model, config)
    assert cuts == [str(model)]
    assert (tmp_path / f"flow-{key}.onnx").stat().st_size > 1000
    assert np.array_equal(speak(first), speak(third))
