"""`python -m stagevisor` runs the operator CLI."""

import os
import sys

# `python -m` puts the working directory first on sys.path; the `stagevisor` command does not. Workers take the
# daemon's sys.path, and a `stagevisor` there (the runtime directory under XDG_RUNTIME_DIR=$PWD) would be imported
# in a spawned worker instead of this package. Stage factories in that directory are still found: workers search
# it explicitly (supervisor/worker/app_paths.py).
if not getattr(sys.flags, "safe_path", False) and sys.path and sys.path[0] == os.getcwd():  # safe_path: 3.11+
    del sys.path[0]

from stagevisor.supervisor.cli import main  # noqa: E402

raise SystemExit(main())
