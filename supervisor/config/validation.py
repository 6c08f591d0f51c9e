"""A pydantic ValidationError in an operator's words: each problem's field, where it is written, and what was wrong."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

from pydantic import BaseModel, ValidationError

from stagevisor.supervisor.config.locations import ConfigLocations, dotted
from stagevisor.supervisor.errors import ConfigError, ErrorCode, KeyPath, Problem, clipped


def validated(model: type[BaseModel], data: Any, where: str, config_path: KeyPath) -> Any:
    """`model` validated from `data`; a ValidationError becomes INVALID_CONFIG led by `where`, its config path
    under `config_path`."""
    try:
        return model.model_validate(data)
    except ValidationError as error:
        text, first, _ = describe(error)
        raise ConfigError(ErrorCode.INVALID_CONFIG, f"{where}: {text}", config_path=(*config_path, *first)) from None


def describe(
    error: ValidationError, locations: ConfigLocations | None = None
) -> tuple[str, KeyPath, tuple[Problem, ...]]:
    """One clause per problem, each led by its `file:line:column` where known but the first (the message
    leads with that one's), then the field path and what was wrong; the config path of the first problem;
    and the problems shown."""
    errors = error.errors()
    # A list whose only item failed is also "too short" (pydantic counts the items that validated):
    # that says nothing the item's own error does not, and wrongly says the list is empty.
    inner = [_entry(item["loc"]) for item in errors if item["type"] not in ("too_short", "too_long")]
    errors = [
        item
        for item in errors
        if item["type"] != "too_short"
        or not any(loc[: len(item["loc"])] == _entry(item["loc"]) and len(loc) > len(item["loc"]) for loc in inner)
    ]
    problems = []
    for item in errors[:3]:
        loc = _entry(item["loc"])
        where = clipped(dotted(loc), 200)
        location = locations.find(loc) if locations is not None else None
        message = clipped(item["msg"].removeprefix("Value error, "), 500)
        if item["type"] == "extra_forbidden":
            message = "unknown key (not part of the schema; check the spelling)"
        elif item["type"] == "missing":
            message = (
                f"position {loc[-1]} is missing (the list is too short)"
                if loc and isinstance(loc[-1], int)
                else "required field is missing"
            )
        elif item["type"] in ("too_short", "too_long"):
            message = _length_message(item)
        problems.append(Problem(where, message, location))
    parts = [
        str(replace(problem, location=None)) if index == 0 else str(problem) for index, problem in enumerate(problems)
    ]
    more = len(errors) - 3
    first: KeyPath = _entry(errors[0]["loc"]) if errors else ()
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else ""), first, tuple(problems)


def _entry(loc: Sequence[str | int]) -> KeyPath:
    """A problem's path to the entry it is about: a mapping key's own problem ends in pydantic's `[key]`, and
    the key is that entry (where it is written, and where the operator looks)."""
    return tuple(loc[:-1]) if tuple(loc[-1:]) == ("[key]",) else tuple(loc)


def _length_message(item: Mapping[str, Any]) -> str:
    """pydantic's `Tuple should have at least 1 item after validation, not 0` in the operator's words."""
    context = item.get("ctx") or {}
    actual = context.get("actual_length")
    got = "none" if actual == 0 else f"{actual}"
    if item["type"] == "too_short":
        least = context.get("min_length")
        return f"needs at least {least} item{'' if least == 1 else 's'}, got {got}"
    most = context.get("max_length")
    return f"takes at most {most} item{'' if most == 1 else 's'}, got {got}"
