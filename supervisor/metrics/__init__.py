"""Observability: Prometheus metrics, measured resources against memory budgets, per-request timings."""
