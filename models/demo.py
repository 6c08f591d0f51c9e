"""The demo model, the default voice: hibari-tts split into preprocessing (G2P), acoustic engine and vocoder, on CPU.

Preprocessing streams to the engine a sentence at a time, so first audio does not wait for the G2P of the whole
text (stages/hibari/executors.py).
"""

from stagevisor.models.declaration import cpu_voice
from stagevisor.supervisor.config import OptionSpec, SpeechConfig

KEY = "demo"
SEED_MAXIMUM = 2**32 - 1
"""The largest seed hibari's noise Generator is given here (stages/hibari/voice.py checks the same)."""

HIBARI_SPEECH = SpeechConfig(
    seed=True,
    seed_maximum=SEED_MAXIMUM,
    options={
        "speed": OptionSpec(minimum=0.25, maximum=4, description="Pace (1.0: the voice's own; 2: twice as fast)."),
        "length_scale": OptionSpec(minimum=0.25, maximum=4, description="Duration factor, the inverse of speed."),
        "seed": OptionSpec(
            type="integer", minimum=0, maximum=SEED_MAXIMUM, description="The noise component's seed (default 0)."
        ),
    },
)
"""What a request to the hibari voice takes beyond text and voice (stages/hibari/voice.py checks the same bounds)."""

DEMO = cpu_voice(
    KEY,
    "hibari",
    HIBARI_SPEECH,
    description=(
        "The default when no model is named: the hibari-tts voice (Apache-2.0, English, 24 kHz) on CPU, "
        "real speech, nothing downloaded."
    ),
    sentence_stream=True,
)

DECLARATIONS = (DEMO,)
