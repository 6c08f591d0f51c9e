"""A two-stage TTS of one's own: the worked example of docs/guides/writing-stages.md."""
