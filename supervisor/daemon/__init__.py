"""The daemon: process groups, their workers' lifecycle, replicas, restarts, live changes, autoscaling and
reports, the local launcher and runtime files (core.py's docstring says which module holds what)."""
