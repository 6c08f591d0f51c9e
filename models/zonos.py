"""Zonos2 (Zyphra): every edge is process-safe (state travels in StagePayload.data); no fractions yet."""

from stagevisor.models.declaration import ModelDeclaration, StageSpec, chain_pipeline

KEY = "zonos2"

ZONOS2 = ModelDeclaration(
    key=KEY,
    display_name="Zonos2",
    paths=("Zyphra/zonos2",),
    architectures=("Zonos2ForCausalLM",),
    # Even preprocessing runs on GPU 0 here, so any split shares that GPU.
    pipeline=chain_pipeline(
        KEY,
        [
            StageSpec("preprocessing", "pipeline", 0),
            StageSpec("speaker_encode", "pipeline", 0),
            StageSpec("tts_engine", "pipeline", 0),
            StageSpec("vocoder", "pipeline", 0),
        ],
        stream=("tts_engine", "vocoder"),
        safe_edges=[("preprocessing", "speaker_encode"), ("speaker_encode", "tts_engine"), ("tts_engine", "vocoder")],
    ),
    standin_executors=True,
)

DECLARATIONS = (ZONOS2,)
