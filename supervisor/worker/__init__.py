"""The worker process: its spec, how it boots, builds its stages and serves its data-plane node."""
