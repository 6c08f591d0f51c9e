"""Imported by the daemon's fork server, never by the daemon: prepares the embedded voice's graphs before any fork.

Importing this module cuts the voice graph in three (prior, flow, decoder: `graphs.split_graphs`)
and keeps the bytes, so every worker forked afterwards builds its onnxruntime
sessions without loading and splitting the model again. Only fork-safe work
happens here: numpy, onnx and protobuf, no thread, no onnxruntime session
(its thread pools do not survive a fork), no gRPC channel or server.
Without the piper extra installed it does nothing.
"""

from __future__ import annotations

try:
    from stagevisor.stages.piper.graphs import split_graphs
    from stagevisor.stages.piper.voice import embedded_voice_paths

    split_graphs(str(embedded_voice_paths()[0]))
except ImportError:  # no embedded voice here: workers load what they need themselves
    pass
