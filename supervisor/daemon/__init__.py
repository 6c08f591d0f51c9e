"""The daemon: process groups, their workers' lifecycle, replicas, the local launcher and runtime files."""
