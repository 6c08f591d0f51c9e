"""Subcommands of the `stagevisor` CLI, one module per concern."""
