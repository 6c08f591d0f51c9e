"""FishAudio S2-Pro: preprocessing in its own process, engine and vocoder sharing one."""

from stagevisor.models.declaration import ModelDeclaration, StageSpec, chain_pipeline

KEY = "fishaudio-s2-pro"

FISHAUDIO_S2_PRO = ModelDeclaration(
    key=KEY,
    display_name="FishAudio S2-Pro",
    paths=("fishaudio/s2-pro",),
    architectures=("FishQwen3OmniForCausalLM",),
    pipeline=chain_pipeline(
        KEY,
        [
            StageSpec("preprocessing", "preprocessing", None),
            StageSpec("tts_engine", "pipeline", 0),
            StageSpec("vocoder", "pipeline", 0),
        ],
        stream=("tts_engine", "vocoder"),
        safe_edges=[("preprocessing", "tts_engine"), ("tts_engine", "vocoder")],
        recommended={("tts_engine", "vocoder"): {"tts_engine": 0.85, "vocoder": 0.10}},
    ),
    standin_executors=True,
)

DECLARATIONS = (FISHAUDIO_S2_PRO,)
