"""Imported by the daemon's fork server, never by the daemon: builds hibari's G2P tables once, before any fork.

The G2P is pure Python (dicts and compiled regular expressions, about 1-3 s to
build), so every worker forked afterwards starts with it instead of building
its own. Only fork-safe work happens here: no thread, no onnxruntime session
(the G2P's out-of-vocabulary network and the acoustic model are made in each
worker after the fork), no gRPC channel or server. Without the demo extra
installed it does nothing.
"""

from __future__ import annotations

try:
    import hibari.g2p  # noqa: F401  (the check that the extra is here; shared_g2p imports it again)
except ImportError:  # no default voice here: workers load what they need themselves
    pass
else:
    from stagevisor.stages.hibari.voice import shared_g2p

    shared_g2p()
