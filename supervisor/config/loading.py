"""Reading a config file: safe YAML loading into a ConfigFile, keeping where each entry is written.

Errors start with `file:line:column:` where the YAML parser or the node tree
gives one, then name the field and what was wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from stagevisor.supervisor.config.file import ConfigFile
from stagevisor.supervisor.config.validation import describe
from stagevisor.supervisor.config.locations import ConfigLocations, mark_location, node_locations
from stagevisor.supervisor.errors import ConfigError, ErrorCode, KeyPath


def _codepoint(character: Any) -> str:
    return f"U+{character:04X}" if isinstance(character, int) else repr(character)


def _yaml_problem(error: yaml.MarkedYAMLError) -> str:
    """PyYAML's problem as one sentence. Its `context` is mostly where the parser was (`while parsing a block
    mapping`), left out since the location says where; but some problems only end a sentence the context starts
    (`expected a single document in the stream` + `but found another document`): those keep it, and the two the
    composer raises read as advice."""
    problem = " ".join((error.problem or str(error)).split())
    context = " ".join((error.context or "").split())
    if context.startswith("expected a single document"):
        return f"a config file holds one YAML document; found a second at line {_line(error.problem_mark)}"
    anchor = re.fullmatch(r"found duplicate anchor (.+); first occurrence", context)
    if anchor:
        return (
            f"anchor {anchor[1]} is defined a second time here (first at line {_line(error.context_mark)}); "
            "give each anchor its own name"
        )
    if context and not context.startswith("while ") and error.problem:
        return f"{context}, {problem}"
    return problem


def _line(mark: Any) -> str:
    return "?" if mark is None else str(mark.line + 1)


@dataclass(frozen=True)
class SourcedConfig:
    """A parsed config file and where each of its entries is written (to locate errors about them)."""

    config: ConfigFile
    locations: ConfigLocations


def parse_config_source(text: str, source: str = "<config>") -> SourcedConfig:
    """Parse YAML text (safe loader only) into a ConfigFile and its locations.

    Errors start with `source:line:column:` where the YAML parser or the node tree gives one, then name the
    field and what was wrong.
    """
    try:
        loader = yaml.SafeLoader(text)  # its reader refuses control characters at once
    except yaml.reader.ReaderError as error:
        raise ConfigError(
            ErrorCode.INVALID_CONFIG,
            f"{source}: malformed YAML: character {_codepoint(error.character)} at offset "
            f"{error.position} is not allowed in YAML; remove it",
        ) from None
    try:
        node = loader.get_single_node()
        locations = node_locations(node, source)
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as error:
        problem = _yaml_problem(error)
        mark = error.problem_mark
        if mark is None:
            raise ConfigError(ErrorCode.INVALID_CONFIG, f"{source}: malformed YAML: {problem}") from None
        location = mark_location(source, mark)
        raise ConfigError(
            ErrorCode.INVALID_CONFIG, f"{location}: malformed YAML: {problem}", location=location
        ) from None
    except yaml.YAMLError as error:
        problem = " ".join(str(error).split())
        raise ConfigError(ErrorCode.INVALID_CONFIG, f"{source}: malformed YAML: {problem}") from None
    except ValueError as error:
        # The constructor converts scalars itself: an integer past Python's
        # digit limit raises ValueError, not a YAMLError.
        raise ConfigError(ErrorCode.INVALID_CONFIG, f"{source}: a value cannot be read: {error}") from None
    finally:
        loader.dispose()
    if data is None:
        raise ConfigError(ErrorCode.INVALID_CONFIG, f"{source}: the file is empty; expected a mapping")
    if not isinstance(data, dict):
        raise ConfigError(
            ErrorCode.INVALID_CONFIG,
            f"{locations.find(()) or source}: expected a mapping with `model_path`/`stages` or `pipeline`, "
            f"got {type(data).__name__}",
            location=locations.find(()),
        )
    try:
        config = ConfigFile.model_validate(data)
    except ValidationError as error:
        text, first, problems = describe(error, locations)
        written = locations.find(first)
        raise ConfigError(
            ErrorCode.INVALID_CONFIG,
            f"{written or source}: {text}",
            config_path=first,
            location=written,
            problems=problems,
        ) from None
    if config.pipeline is not None and (config.model_path is not None or config.stages):
        raise locations.locate(
            ConfigError(
                ErrorCode.INVALID_CONFIG,
                f"{source}: give either `pipeline` (a pipeline declared in full) or `model_path` with "
                "`stages` overrides, not both",
                config_path=("pipeline",),
            )
        )
    return SourcedConfig(config, locations)


def parse_config_text(text: str, source: str = "<config>") -> ConfigFile:
    """Parse YAML text (safe loader only) into a ConfigFile; errors name the file, line, column and field."""
    return parse_config_source(text, source).config


def config_key_lines(path: str | Path) -> dict[KeyPath, int]:
    """Each key path of a config file (as `load_config` reads it) -> its 1-based line, for `plan --explain`."""
    text = Path(path).read_text(encoding="utf-8")
    loader = yaml.SafeLoader(text)
    try:
        return node_locations(loader.get_single_node(), str(path)).lines()
    finally:
        loader.dispose()


def load_config_source(path: str | Path) -> SourcedConfig:
    """Read and parse a YAML config file, keeping where each entry is written."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(ErrorCode.INVALID_CONFIG, f"cannot read config {str(path)!r}: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(
            ErrorCode.INVALID_CONFIG,
            f"{path}: not UTF-8 text (byte 0x{error.object[error.start]:02x} at offset {error.start}); "
            "save the config as UTF-8",
        ) from None
    return parse_config_source(text, str(path))


def load_config(path: str | Path) -> ConfigFile:
    """Read and parse a YAML config file."""
    return load_config_source(path).config
