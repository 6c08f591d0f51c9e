"""stagevisor: a gRPC-based multi-process stage supervisor for TTS pipelines."""

__version__ = "0.1.0"
