"""Stage executors: the Stage contract and the built-in executors."""

from stages.base import Stage, StageContext, StageError, StagePayload

__all__ = ["Stage", "StageContext", "StageError", "StagePayload"]
