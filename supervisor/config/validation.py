"""A pydantic ValidationError in an operator's words: each problem's field, where it is written, and what was wrong."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Mapping, Sequence

from pydantic import BaseModel, ValidationError

from stagevisor.supervisor.config.locations import ConfigLocations, dotted
from stagevisor.supervisor.errors import ConfigError, ErrorCode, KeyPath, Problem, clipped, shown


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
    inner = [_entry(item) for item in errors if item["type"] not in ("too_short", "too_long")]
    errors = [
        item
        for item in errors
        if item["type"] != "too_short"
        or not any(loc[: len(item["loc"])] == _entry(item) and len(loc) > len(item["loc"]) for loc in inner)
    ]
    problems = []
    for item in errors[:3]:
        loc = _entry(item)
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
        else:
            message = _own_words(item, message)
        problems.append(Problem(where, message, location))
    parts = [
        str(replace(problem, location=None)) if index == 0 else str(problem) for index, problem in enumerate(problems)
    ]
    more = len(errors) - 3
    first: KeyPath = _entry(errors[0]) if errors else ()
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else ""), first, tuple(problems)


def _entry(item: Mapping[str, Any]) -> KeyPath:
    """A problem's path to the entry it is about: a mapping key's own problem ends in pydantic's `[key]`, and
    the key is that entry (where it is written, and where the operator looks).

    pydantic writes a key that is no string or int into its path as text (a null key as 'None', `1.5:` as
    '1.5') and `true:` as 1, which is no key of the file (ConfigLocations keys each entry by the key YAML
    read): a key's own problem carries the key itself as its input, and that is the path's last part.
    """
    loc: Sequence[str | int] = item["loc"]
    if tuple(loc[-1:]) == ("[key]",):
        return (*loc[:-2], item.get("input"))
    if item["type"] == "invalid_key":  # a key that is no string, where the schema takes any key (`args`)
        return (*loc[:-1], item.get("input"))
    return tuple(loc)


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


_EXPECTED = {
    "model_type": "a mapping of settings",
    "model_attributes_type": "a mapping of settings",
    "dict_type": "a mapping",
    "tuple_type": "a list",
    "list_type": "a list",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "finite_number": "a finite number",
}
"""pydantic's error types -> what the entry must be, in the operator's words (`Input should be a valid tuple`
says `tuple`, a Python type, where the YAML has a list)."""

_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def _own_words(item: Mapping[str, Any], message: str) -> str:
    """A pydantic message (`Input should be a valid dictionary or instance of RuntimeConfig`, `Input should be
    greater than 0`) as `must be a mapping of settings, got 3`; a message a validator of ours wrote, unchanged."""
    kind = item["type"]
    value = item.get("input")
    got = f", got {'null' if value is None else shown(value)}"
    if kind == "invalid_key":  # a key that YAML read as a number, a list...: the input is the key
        return f"a key must be a string, got {'null' if value is None else shown(value)}"
    if kind in _EXPECTED:
        return f"must be {_EXPECTED[kind]}{got}"
    if kind in _BOUNDS:
        if isinstance(value, float) and math.isnan(value):  # NaN fails every bound, whichever pydantic names
            return "must be a number, got NaN"
        bound = next(iter((item.get("ctx") or {}).values()), None)
        shown_bound = f"{bound:g}" if isinstance(bound, (int, float)) else bound  # 600, not 600.0
        return f"must be {_BOUNDS[kind]} {shown_bound}{got}"
    context = item.get("ctx") or {}
    if kind == "string_too_short":
        least = context.get("min_length", 1)
        return f"must not be empty{got}" if least == 1 else f"must be at least {least} characters{got}"
    if kind == "string_too_long":  # the value itself may be long: say its length
        return f"must be at most {context.get('max_length')} characters, got {len(str(value))}"
    if message.startswith("Input should be "):  # any other pydantic check: its wording, in our form
        return f"must be {message.removeprefix('Input should be ')}{got}"
    return message
