"""The daemon's HTTP surface: the OpenAI-compatible speech API, health and readiness, and the playground page."""
