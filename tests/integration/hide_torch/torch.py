"""Not torch: on PYTHONPATH (daemon_helpers.without_torch), it makes `import torch` fail.

A GPU group's worker imports torch only to bind its device (supervisor/worker/main.py:
bind_gpu); without CUDA it then runs its stages on CPU either way, so the
integration tests that do not test torch itself skip that import's cost.
"""

raise ImportError(
    "torch is hidden from this test's processes (tests/integration/hide_torch; "
    "mark the test `worker_torch` to let them import it)"
)
