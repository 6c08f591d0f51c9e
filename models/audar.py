"""Audar-TTS: every edge is process-safe (state travels in StagePayload.data); no fractions yet."""

from stagevisor.models.declaration import ModelDeclaration, StageSpec, chain_pipeline

KEY = "audar-tts"

AUDAR_TTS = ModelDeclaration(
    key=KEY,
    display_name="Audar-TTS",
    paths=("audarai/Audar-TTS-V1-Turbo",),
    architectures=("AudarTTSForConditionalGeneration",),
    # No benchmark coverage yet, so no recommended fractions: splitting on the
    # shared GPU needs the operator to declare them.
    pipeline=chain_pipeline(
        KEY,
        [
            StageSpec("preprocessing", "pipeline", None),
            StageSpec("reference_encoder", "pipeline", 0),
            StageSpec("tts_engine", "pipeline", 0),
            StageSpec("vocoder", "pipeline", 0),
        ],
        stream=("tts_engine", "vocoder"),
        safe_edges=[
            ("preprocessing", "reference_encoder"),
            ("reference_encoder", "tts_engine"),
            ("tts_engine", "vocoder"),
        ],
    ),
    standin_executors=True,
)

DECLARATIONS = (AUDAR_TTS,)
