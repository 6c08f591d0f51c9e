"""The default voice: hibari-tts (Apache-2.0, 24 kHz English) split into G2P, acoustic model and DSP stages."""
