"""Higgs-TTS (Boson AI): a frontend process, the engine, and the vocoder in its own process."""

from stagevisor.models.declaration import ModelDeclaration, StageSpec, chain_pipeline

KEY = "higgs-tts"

HIGGS_TTS = ModelDeclaration(
    key=KEY,
    display_name="Higgs-TTS",
    paths=("bosonai/higgs-tts-3-4b",),
    architectures=("HiggsMultimodalQwen3ForConditionalGeneration",),
    # The built-in config already isolates the vocoder and groups the two
    # frontend stages, with fractions for every GPU stage declared.
    pipeline=chain_pipeline(
        KEY,
        [
            StageSpec("preprocessing", "tts_frontend", None),
            StageSpec("audio_encoder", "tts_frontend", 0, 0.03),
            StageSpec("tts_engine", "pipeline", 0, 0.85),
            StageSpec("vocoder", "vocoder", 0, 0.10),
        ],
        stream=("tts_engine", "vocoder"),
        safe_edges=[("preprocessing", "audio_encoder"), ("audio_encoder", "tts_engine"), ("tts_engine", "vocoder")],
    ),
    standin_executors=True,
    description="Reference-audio encoder in a frontend process; vocoder isolated by default.",
)

DECLARATIONS = (HIGGS_TTS,)
