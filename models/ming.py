"""Ming-Omni-TTS (inclusionAI): its vocoder role is the model-specific `audio_decode` stage."""

from stagevisor.models.declaration import ModelDeclaration, StageSpec, chain_pipeline

KEY = "ming-omni-tts"

_SHARED_FRONT_STATE = "the front stages share in-process state with the engine, which a second process cannot read"

MING_OMNI_TTS = ModelDeclaration(
    key=KEY,
    display_name="Ming-Omni-TTS",
    paths=("inclusionAI/Ming-omni-tts-16.8B-A3B",),
    architectures=("BailingMMNativeForConditionalGeneration",),
    pipeline=chain_pipeline(
        KEY,
        [
            StageSpec("preprocessing", "pipeline", None),
            StageSpec("reference_encode", "pipeline", 0),
            StageSpec("tts_engine", "pipeline", 0),
            StageSpec("audio_decode", "pipeline", 0),
        ],
        stream=("tts_engine", "audio_decode"),
        safe_edges=[("tts_engine", "audio_decode")],
        # The reference encoder stays with the engine but still needs its own
        # share once a second process lands on the GPU.
        recommended={
            ("tts_engine", "audio_decode"): {"reference_encode": 0.08, "tts_engine": 0.72, "audio_decode": 0.12}
        },
        role_aliases={"vocoder": "audio_decode"},
    ),
    unsafe_reasons={
        ("preprocessing", "reference_encode"): _SHARED_FRONT_STATE,
        ("reference_encode", "tts_engine"): _SHARED_FRONT_STATE,
    },
    standin_executors=True,
)

DECLARATIONS = (MING_OMNI_TTS,)
