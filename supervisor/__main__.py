"""`python -m supervisor` runs the operator CLI."""

from supervisor.cli import main

raise SystemExit(main())
