"""Stage executors: the Stage contract and the built-in executors."""

from stagevisor.stages.base import InvalidRequest, Stage, StageContext, StageError, StagePayload

__all__ = ["InvalidRequest", "Stage", "StageContext", "StageError", "StagePayload"]
