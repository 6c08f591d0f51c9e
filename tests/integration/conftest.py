"""Integration tests start their daemons without torch unless marked `worker_torch`.

Without CUDA (these tests' machines), a GPU group's worker binds no device
whether or not torch imports, and runs its stages on CPU with the same warning;
importing torch only costs seconds of CPU in every GPU group's worker of every
daemon. So each test's daemons (daemon_helpers.DaemonProcess, ServeProcess,
daemon_env) get `import torch` made to fail, except in tests marked
`@pytest.mark.worker_torch` (those that check torch itself) and in the Ray
launcher's files, which are left as they are. Set before the test's fixtures,
so a module-scoped daemon follows the module's first test.
"""

from __future__ import annotations


import pytest

from tests.integration import daemon_helpers

KEEP_TORCH_FILES = ("test_ray_",)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    daemon_helpers.WORKERS_IMPORT_TORCH = item.get_closest_marker(
        "worker_torch"
    ) is not None or item.path.name.startswith(KEEP_TORCH_FILES)


def pytest_runtest_teardown(item: pytest.Item) -> None:
    daemon_helpers.WORKERS_IMPORT_TORCH = True
