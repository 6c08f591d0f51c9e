"""Voxtral TTS (Mistral): preprocessing shares in-process state with the generation stage."""

from stagevisor.models.declaration import ModelDeclaration, StageSpec, chain_pipeline

KEY = "voxtral-tts"

VOXTRAL_TTS = ModelDeclaration(
    key=KEY,
    display_name="Voxtral TTS",
    paths=("mistralai/Voxtral-4B-TTS-2603",),
    architectures=("VoxtralTTSForConditionalGeneration",),
    pipeline=chain_pipeline(
        KEY,
        [
            StageSpec("preprocessing", "pipeline", None),
            StageSpec("tts_generation", "pipeline", 0),
            StageSpec("vocoder", "pipeline", 0),
        ],
        stream=("tts_generation", "vocoder"),
        safe_edges=[("tts_generation", "vocoder")],
        recommended={("tts_generation", "vocoder"): {"tts_generation": 0.85, "vocoder": 0.10}},
    ),
    unsafe_reasons={
        ("preprocessing", "tts_generation"): (
            "preprocessing shares in-process state with the generation engine, which a second process cannot read"
        ),
    },
    standin_executors=True,
)

DECLARATIONS = (VOXTRAL_TTS,)
