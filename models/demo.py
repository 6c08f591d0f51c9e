"""The demo model: the embedded Piper voice split into preprocessing, acoustic engine and vocoder, on CPU."""

from stagevisor.models.declaration import ModelDeclaration, StageSpec, chain_pipeline

KEY = "demo"

DEMO = ModelDeclaration(
    key=KEY,
    display_name="demo",
    pipeline=chain_pipeline(
        KEY,
        [
            StageSpec("preprocessing", "pipeline", None),
            StageSpec("tts_engine", "pipeline", None),
            StageSpec("vocoder", "pipeline", None),
        ],
        stream=("tts_engine", "vocoder"),
        safe_edges=[("preprocessing", "tts_engine"), ("tts_engine", "vocoder")],
        factory=lambda stage: f"stagevisor.stages.piper.executors:{stage}",
    ),
    description="The embedded default when no model is named: real speech on CPU, nothing downloaded.",
)

DECLARATIONS = (DEMO,)
