"""The Piper voice (GPL phonemizer, the `piper` extra): graphs split into acoustic model and decoder; executors."""
