"""`python -m stagevisor` runs the operator CLI."""

from stagevisor.supervisor.cli import main

raise SystemExit(main())
