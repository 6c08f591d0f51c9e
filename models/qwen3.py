"""Qwen3-TTS (Qwen): real executors on qwen-tts (stages/qwen3); prepared prompts live in a process-local registry."""

import json

from stagevisor.models.declaration import ModelDeclaration, StageSpec, chain_pipeline
from stagevisor.stages.qwen3.checkpoint import HUB_IDS, Checkpoint, CheckpointError, locate, requirements
from stagevisor.stages.qwen3.request import MAX_SEED, SAMPLING, Sampling, most_frames, sampling_defaults
from stagevisor.supervisor.config import OptionSpec, SpeechConfig

KEY = "qwen3-tts"


def sampling_options(defaults: Sampling) -> dict[str, OptionSpec]:
    """The package's sampling arguments as request options; max_new_tokens up to what `defaults` allow."""
    return {
        name: OptionSpec(
            type=option.type,
            minimum=option.minimum,
            maximum=most_frames(defaults) if name == "max_new_tokens" else option.maximum,
            description=option.description,
        )
        for name, option in SAMPLING.items()
    }


QWEN3_SPEECH = SpeechConfig(
    clones=True,
    instructions=True,
    seed=True,
    seed_maximum=MAX_SEED,
    speed=False,  # no speaking-rate control: its stages refuse `speed` and `length_scale` (QWEN3_NO_SPEED)
    languages=(
        "auto",
        "chinese",
        "english",
        "japanese",
        "korean",
        "german",
        "french",
        "russian",
        "portuguese",
        "spanish",
        "italian",
    ),
    options=sampling_options(Sampling()),
)
"""What a request may carry; each checkpoint type serves a part of it (Base clones, CustomVoice has speakers and,
at 1.7B, follows instructions, VoiceDesign follows instructions) and refuses the rest with a coded error."""


def checkpoint_speech(model_path: str | None) -> SpeechConfig | None:
    """QWEN3_SPEECH narrowed to what the checkpoint does (cloning: Base; instructions; its own languages), so
    `GET /v1/models` tells clients, and the HTTP API refuses what it cannot do with its usual codes; None where no
    checkpoint is found (`serve` then stops on the requirements)."""
    try:
        checkpoint = locate(None if model_path == KEY else model_path)
    except CheckpointError:
        return None
    return QWEN3_SPEECH.model_copy(
        update={
            "clones": checkpoint.clones,
            "instructions": checkpoint.follows_instructions,
            "languages": checkpoint.languages,
            "options": sampling_options(_defaults(checkpoint)),
        }
    )


def _defaults(checkpoint: Checkpoint) -> Sampling:
    """The checkpoint's own sampling defaults; the package's where its generation_config.json is unusable (the
    engine's start then fails, naming the file and the value)."""
    try:
        return sampling_defaults(json.loads((checkpoint.directory / "generation_config.json").read_text("utf-8")))
    except (OSError, ValueError):
        return Sampling()


def _factory(stage: str) -> str:
    return f"stagevisor.stages.qwen3:{stage}"


QWEN3_TTS = ModelDeclaration(
    key=KEY,
    display_name="Qwen3-TTS",
    paths=HUB_IDS,
    architectures=("Qwen3TTSForConditionalGeneration",),
    pipeline=chain_pipeline(
        KEY,
        [
            StageSpec("preprocessing", "pipeline", None),
            StageSpec("tts_engine", "pipeline", 0),
            StageSpec("vocoder", "pipeline", 0),
        ],
        stream=("tts_engine", "vocoder"),
        safe_edges=[("tts_engine", "vocoder")],
        recommended={("tts_engine", "vocoder"): {"tts_engine": 0.85, "vocoder": 0.10}},
        factory=_factory,
        speech=QWEN3_SPEECH,
    ),
    unsafe_reasons={
        ("preprocessing", "tts_engine"): (
            "prepared prompts (embedded with the talker's own text embeddings, tensors on its device) live in the "
            "process-local PREPARED_REQUESTS registry (stages/qwen3/executors.py), read in-process by the tts_engine"
        ),
    },
    requirements=requirements,
    # Without a seed its preprocessing draws one at random for each request (stages/qwen3/executors.py).
    repeatable_options={"seed": "0"},
    speech_for=checkpoint_speech,
    description=(
        "real executors (qwen-tts, Apache-2.0; the qwen3 extra): a 12 Hz Base, CustomVoice or VoiceDesign "
        "checkpoint from a local directory or the local Hugging Face cache"
    ),
)

DECLARATIONS = (QWEN3_TTS,)
