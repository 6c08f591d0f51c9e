"""Qwen3-TTS (Qwen): prepared requests live in process-local registries the engine reads."""

from stagevisor.models.declaration import ModelDeclaration, StageSpec, chain_pipeline

KEY = "qwen3-tts"

QWEN3_TTS = ModelDeclaration(
    key=KEY,
    display_name="Qwen3-TTS",
    paths=("Qwen/Qwen3-TTS-12Hz-1.7B-Base", "Qwen/Qwen3-TTS-12Hz-0.6B-Base"),
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
    ),
    unsafe_reasons={
        ("preprocessing", "tts_engine"): (
            "prepared requests live in _PREPROCESSING_CONTEXT / _PREPARED_REQUESTS, read in-process "
            "by the AR engine builder"
        ),
    },
    standin_executors=True,
)

DECLARATIONS = (QWEN3_TTS,)
