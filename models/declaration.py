"""ModelDeclaration: what a model says about its stages, their topology and how they may be split."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from stagevisor.supervisor.config import EdgeResources, PipelineConfig, SpeechConfig, StageConfig
from stagevisor.supervisor.plan import STANDIN_FACTORY

__all__ = ["STANDIN_PRELOAD", "STANDIN_SPEECH", "ModelDeclaration", "Requirements", "StageSpec", "chain_pipeline"]

STANDIN_SPEECH = SpeechConfig(clones=True, seed=True)
"""What a request to a stand-in model takes: a reference (every stand-in encodes one; the voice it speaks with
stays the default one), a seed, and the default voice's options, which its stages check."""
STANDIN_PRELOAD = ("stagevisor.stages.hibari.preload",)
"""What the stand-in executors' workers preload: the default voice's G2P tables, built once in the fork server."""

Requirements = Callable[[str | None], Sequence[str]]
"""What a model needs beyond its executors' extras, checked before any worker starts (see `requirements`)."""


@dataclass(frozen=True)
class ModelDeclaration:
    """A built-in (or third-party) model: its pipeline plus how the registry finds it.

    `pipeline` carries the declared topology, the process-safe edges, the
    recommended fractions per edge and the role aliases. `unsafe_reasons`
    explains, per unsupported edge, why its handoff breaks across processes;
    `unsafe_reason` does so for a model none of whose edges may be split.
    """

    key: str
    display_name: str
    pipeline: PipelineConfig
    paths: tuple[str, ...] = ()
    architectures: tuple[str, ...] = ()
    unsafe_reasons: Mapping[tuple[str, str], str] = field(default_factory=dict)
    unsafe_reason: str | None = None
    standin_executors: bool = False
    """True when the executors are stand-ins built on the embedded voice, not the real weights."""
    description: str = ""
    requirements: Requirements | None = None
    """Called with the model path the operator named (None: the default model) before any worker starts;
    returns one message per unmet requirement (a checkpoint not found: name the paths searched; a package
    missing: name the extra to install), empty when the model can run here. `serve` stops with these
    messages (exit status 1)."""
    repeatable_options: Mapping[str, str] = field(default_factory=dict)
    """Request options that make its audio repeatable: the same text and options give the same bytes, run after
    run and in every topology. `check` and `bench --check-identical` send them unless the operator gives the
    option. Empty where its defaults already are (the default voice's seed defaults to 0)."""
    speech_for: Callable[[str | None], SpeechConfig | None] | None = None
    """Called with the model path at `serve`, for a model whose checkpoints take different requests: what a
    request may carry on that one (read from its small files, never its weights), or None where none is found;
    `speech()` falls back to the pipeline's declared `speech`."""
    runtime_fraction_args: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Stage -> engine memory arguments in its `args`, beyond the well-known ones, that size GPU memory as a
    share of the device; `plan` compares them with the stage's placement fraction."""
    worker_preload: tuple[str, ...] = ()
    """Modules its CPU workers import once in the daemon's fork server before any is forked: import-only and
    fork-safe (pure data, no threads, no gRPC or CUDA), e.g. a voice's graph as bytes. Stand-in models
    preload STANDIN_PRELOAD unless they name their own."""

    def speech(self, model_path: str | None) -> SpeechConfig:
        """What a request may carry when serving `model_path`: the checkpoint's (`speech_for`), else the declared."""
        found = self.speech_for(model_path) if self.speech_for is not None else None
        return found if found is not None else self.pipeline.speech

    def preload(self) -> tuple[str, ...]:
        """What its workers preload: `worker_preload`, else STANDIN_PRELOAD for stand-in executors."""
        return self.worker_preload or (STANDIN_PRELOAD if self.standin_executors else ())

    def unsupported_edges(self) -> tuple[tuple[str, str], ...]:
        """Links of the pipeline that may not cross a process boundary, in stage order."""
        safe = set(self.pipeline.process_safe_edges)
        return tuple(link for link in self.pipeline.links() if link not in safe)

    def reason_for(self, edge: tuple[str, str]) -> str | None:
        return self.unsafe_reasons.get(edge, self.unsafe_reason)


@dataclass(frozen=True)
class StageSpec:
    """Shorthand for one row of a built-in chain: name, process, gpu, declared fraction."""

    name: str
    process: str
    gpu: int | None
    fraction: float | None = None


def chain_pipeline(
    key: str,
    stages: Sequence[StageSpec],
    *,
    stream: tuple[str, str],
    front_stream: tuple[str, str] | None = None,
    safe_edges: Sequence[tuple[str, str]] = (),
    recommended: Mapping[tuple[str, str], Mapping[str, float]] | None = None,
    role_aliases: Mapping[str, str] | None = None,
    factory: str | Callable[[str], str] = STANDIN_FACTORY,
    speech: SpeechConfig | None = None,
) -> PipelineConfig:
    """Build the pipeline of a chain model: each stage's `next` is the following stage.

    `stream` names the link that is also a `stream_to` edge (engine to
    vocoder); `front_stream`, one before it that streams too (the default
    voice's preprocessing hands its engine a sentence at a time). With the stand-in factory every stage gets
    `args={"model": key, "stage": name}`; a callable `factory` maps a stage
    name to its own import path and gets empty args. `speech` is what a
    request may carry (default: STANDIN_SPEECH for stand-ins, else nothing
    beyond text and voice).
    """
    configs = []
    for index, spec in enumerate(stages):
        following = (stages[index + 1].name,) if index + 1 < len(stages) else ()
        configs.append(
            StageConfig(
                name=spec.name,
                factory=factory(spec.name) if callable(factory) else factory,
                args={"model": key, "stage": spec.name} if factory == STANDIN_FACTORY else {},
                process=spec.process,
                gpu=spec.gpu,
                next=following,
                stream_to=following if following and (spec.name, following[0]) in (stream, front_stream) else (),
                runtime={"resources": {"total_gpu_memory_fraction": spec.fraction}},
            )
        )
    return PipelineConfig(
        name=key,
        stages=tuple(configs),
        process_safe_edges=tuple(safe_edges),
        process_edge_resources=tuple(
            EdgeResources(edge=edge, fractions=dict(fractions)) for edge, fractions in (recommended or {}).items()
        ),
        role_aliases=dict(role_aliases or {}),
        speech=speech or (STANDIN_SPEECH if factory == STANDIN_FACTORY else SpeechConfig()),
    )


def cpu_voice(
    key: str,
    package: str,
    speech: SpeechConfig,
    description: str,
    sentence_stream: bool = False,
    repeatable_options: Mapping[str, str] | None = None,
) -> ModelDeclaration:
    """A voice with real executors, split the way both bundled voices are: preprocessing -> tts_engine ->
    vocoder in one process group on CPU, every edge process-safe, the engine streaming to the vocoder.

    `sentence_stream`: preprocessing streams to the engine too (its phonemes a sentence at a time), so the
    engine starts on the first sentence while the rest of the text is read.

    Its executors are `stagevisor.stages.<package>.executors:<stage>`; its workers preload
    `stagevisor.stages.<package>.preload`. `repeatable_options`: as ModelDeclaration's.
    """
    stages = [StageSpec(name, "pipeline", None) for name in ("preprocessing", "tts_engine", "vocoder")]
    return ModelDeclaration(
        key=key,
        display_name=key,
        pipeline=chain_pipeline(
            key,
            stages,
            stream=("tts_engine", "vocoder"),
            front_stream=("preprocessing", "tts_engine") if sentence_stream else None,
            safe_edges=[("preprocessing", "tts_engine"), ("tts_engine", "vocoder")],
            factory=lambda stage: f"stagevisor.stages.{package}.executors:{stage}",
            speech=speech,
        ),
        description=description,
        worker_preload=(f"stagevisor.stages.{package}.preload",),
        repeatable_options=dict(repeatable_options or {}),
    )
