"""MOSS-TTS (OpenMOSS): Local single-GPU, Local split across two GPUs, and Delay."""

from stagevisor.models.declaration import ModelDeclaration, StageSpec, chain_pipeline

_QUEUE_REASON = "preprocessing publishes into a process-local PreparedRequestQueue that the AR engine pops"

MOSS_TTS_LOCAL = ModelDeclaration(
    key="moss-tts-local",
    display_name="MOSS-TTS Local (single-GPU)",
    paths=("OpenMOSS-Team/MOSS-TTS-Local-Transformer-v1.5",),
    architectures=("MossTTSLocalModel",),
    pipeline=chain_pipeline(
        "moss-tts-local",
        [
            StageSpec("preprocessing", "pipeline", 0),
            StageSpec("tts_engine", "pipeline", 0, 0.90),
            StageSpec("vocoder", "pipeline", 0),
        ],
        stream=("tts_engine", "vocoder"),
        safe_edges=[("tts_engine", "vocoder")],
        recommended={("tts_engine", "vocoder"): {"preprocessing": 0.05, "tts_engine": 0.90, "vocoder": 0.05}},
    ),
    unsafe_reasons={("preprocessing", "tts_engine"): _QUEUE_REASON},
    standin_executors=True,
)

# Same weights; the codec runs on a second GPU the placement declaration does not describe.
MOSS_TTS_LOCAL_SPLIT = ModelDeclaration(
    key="moss-tts-local-split",
    display_name="MOSS-TTS Local (split)",
    pipeline=chain_pipeline(
        "moss-tts-local-split",
        [
            StageSpec("preprocessing", "pipeline", 0),
            StageSpec("tts_engine", "pipeline", 0),
            StageSpec("vocoder", "pipeline", 0),
        ],
        stream=("tts_engine", "vocoder"),
    ),
    unsafe_reason=(
        "placement declares GPU 0 while the codec runs on cuda:1, so the colocated fractions "
        "do not describe this topology"
    ),
    standin_executors=True,
    description="Selected by registry key only.",
)

MOSS_TTS_DELAY = ModelDeclaration(
    key="moss-tts-delay",
    display_name="MOSS-TTS Delay",
    paths=("OpenMOSS-Team/MOSS-TTS-v1.5",),
    architectures=("MossTTSDelayModel",),
    pipeline=chain_pipeline(
        "moss-tts-delay",
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
        ("preprocessing", "tts_engine"): "same process-local PreparedRequestQueue handoff: " + _QUEUE_REASON
    },
    standin_executors=True,
)

DECLARATIONS = (MOSS_TTS_LOCAL, MOSS_TTS_LOCAL_SPLIT, MOSS_TTS_DELAY)
