"""The supervisor: config schema, placement planning, daemon, workers, data plane, admin API, CLI."""
