"""The codes the built-in stages' refusals of a request carry, one per kind of problem (stages/README.md lists them).

Each refusal names the request field it is about beside its code (StageError's
`field`): `text` for the TEXT_ codes, the option's key for the option codes,
`voice`, `reference_audio`. A model's own refusals (Qwen3-TTS's `QWEN3_...`)
and the daemon's NOTHING_SPEAKABLE (stages/base.py) are elsewhere.
"""

from __future__ import annotations

TEXT_EMPTY = "TEXT_EMPTY"
"""The request has no text, or only whitespace."""
TEXT_TOO_LONG = "TEXT_TOO_LONG"
"""The text has more characters than the stage accepts (its `max_text_chars`)."""
TEXT_UNREADABLE = "TEXT_UNREADABLE"
"""The voice's G2P cannot read the text (the default voice: a number of more than 36 digits)."""
TEXT_TOO_COMPLEX = "TEXT_TOO_COMPLEX"
"""The text would hold the voice's G2P longer than its budget (words run together from many pieces)."""
UNKNOWN_VOICE = "UNKNOWN_VOICE"
"""The request names a voice the model does not have."""
UNKNOWN_OPTION = "UNKNOWN_OPTION"
"""An option the model does not take."""
INVALID_OPTION = "INVALID_OPTION"
"""An option's value the model does not take: not a number, out of its range, too long."""
CONFLICTING_OPTIONS = "CONFLICTING_OPTIONS"
"""Two options that say the same thing, given together (`speed` and `length_scale`; the seed twice)."""
CLONING_NOT_SUPPORTED = "CLONING_NOT_SUPPORTED"
"""Reference audio sent to a model that speaks only its own voices."""
