"""stagevisor: a gRPC-based multi-process stage supervisor for TTS pipelines.

This is the one top-level import package the distribution installs. Its
sub-packages live in the repository's top-level directories and are mapped in
by pyproject.toml: `stagevisor.supervisor` (supervisor/), `stagevisor.stages`
(stages/) and `stagevisor.models` (models/).
"""

__version__ = "0.1.0"
