"""TLS and bearer tokens: secret files both sides read (files), the daemon's endpoints (server), the CLI (client)."""
