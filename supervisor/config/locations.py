"""Where each entry of a YAML config is written: key paths -> file, line and column, from PyYAML's node marks.

Pure: walks the node tree PyYAML composes (before construction) and answers
lookups. The config loader keeps one ConfigLocations per file; planning never
sees it, and an error that names its config path is located afterwards.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import yaml

from stagevisor.supervisor.errors import ConfigError, ErrorCode, KeyPath, SourceLocation, StagevisorError

MERGE_TAG = "tag:yaml.org,2002:merge"

_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
_YAML_SCALAR: dict[Any, str] = {None: "null", True: "true", False: "false"}
ECHO_CHARS = 40
"""At most this much of an unknown key is quoted back in an error message."""


def dotted(path: tuple[Any, ...]) -> str:
    """A key path as an operator reads it: `pipeline.stages[2].stream_to[0]`; a key that YAML read as null, a
    boolean or a float as YAML writes it, in brackets (`processes[null]`)."""
    out = ""
    for part in path:
        if part is None or isinstance(part, (bool, float)):
            out += f"[{repr(part) if isinstance(part, float) else _YAML_SCALAR[part]}]"
            continue
        if not isinstance(part, int) and not _PLAIN_KEY.match(str(part)):
            part = repr(str(part)[:ECHO_CHARS])  # a key with spaces or line breaks stays one readable line
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def mark_location(file: str, mark: yaml.Mark) -> SourceLocation:
    """A PyYAML mark (0-based) as a 1-based location."""
    return SourceLocation(file, mark.line + 1, mark.column + 1)


class ConfigLocations:
    """Each key path of one config document -> where it is written.

    A mapping key's path points at the key (`stream_to:`), a sequence item's at the item itself.
    """

    def __init__(self, file: str, marks: Mapping[KeyPath, SourceLocation]) -> None:
        self.file = file
        self._marks = dict(marks)

    def find(self, path: tuple[Any, ...]) -> SourceLocation | None:
        """The deepest prefix of `path` that is written in the file (a missing field: its entry)."""
        # A key written `1:` is the int 1 in a validation error but the string "1" in the node tree.
        for end in range(len(path), -1, -1):
            for prefix in (path[:end], path[: end - 1] + (str(path[end - 1]),) if end else ()):
                if prefix in self._marks:
                    return self._marks[prefix]
        return None

    def lines(self) -> dict[KeyPath, int]:
        """Each written key path -> its line."""
        return {path: location.line for path, location in self._marks.items()}

    def locate(self, error: StagevisorError) -> StagevisorError:
        """The error located at the entry its config path names; unchanged when it names none."""
        if not error.config_path or error.location is not None:
            return error
        location = self.find(error.config_path)
        return error.at(location) if location is not None else error


def node_locations(node: yaml.Node | None, file: str) -> ConfigLocations:
    """The locations of a composed YAML document; rejects duplicate keys and recursive aliases.

    Runs on the composed node tree before construction: constructing a
    document flattens `<<` merge keys into the mapping in place, which would
    make every merged key look like a duplicate.
    """
    marks: dict[KeyPath, SourceLocation] = {}
    if node is not None:
        _walk(node, file, (), marks, set(), ())
    return ConfigLocations(file, marks)


_UNREADABLE = object()


def _key(node: yaml.Node) -> Any:
    """The key a mapping key's node stands for, as the document's construction reads it (`null:` is None, `1:`
    the int 1, `yes:` True), so an error about the key finds it; _UNREADABLE for a key that construction
    refuses (a list, a mapping: unhashable; an integer past Python's digit limit), which it reports itself."""
    if not isinstance(node, yaml.ScalarNode):
        return _UNREADABLE
    try:
        return yaml.constructor.SafeConstructor().construct_object(node)
    except (ValueError, yaml.YAMLError):
        return _UNREADABLE


def _walk(
    node: yaml.Node,
    file: str,
    path: KeyPath,
    out: dict[KeyPath, SourceLocation],
    seen_nodes: set[int],
    ancestors: tuple[int, ...],
) -> None:
    out.setdefault(path, mark_location(file, node.start_mark))
    if id(node) in ancestors:
        location = mark_location(file, node.start_mark)
        raise ConfigError(
            ErrorCode.INVALID_CONFIG,
            f"{location}: {dotted(path) or 'document'}: an alias refers to a node that contains it; "
            "recursive YAML structures are not allowed",
            config_path=path,
            location=location,
        )
    if id(node) in seen_nodes:
        # Every alias of an anchor is the same node: walk it once, so nested
        # aliases cannot make this walk exponential.
        return
    seen_nodes.add(id(node))
    ancestors = ancestors + (id(node),)
    if isinstance(node, yaml.MappingNode):
        keys: set[Any] = set()
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG:
                _walk(value_node, file, path, out, seen_nodes, ancestors)
                continue
            key = _key(key_node)
            if key is _UNREADABLE:  # a list or mapping as a key, or a scalar YAML cannot construct: its own error
                continue
            location = mark_location(file, key_node.start_mark)
            if key in keys:
                raise ConfigError(
                    ErrorCode.INVALID_CONFIG,
                    f"{location}: {dotted(path + (key,))}: key given twice",
                    config_path=path + (key,),
                    location=location,
                )
            keys.add(key)
            out[path + (key,)] = location
            _walk(value_node, file, path + (key,), out, seen_nodes, ancestors)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, file, path + (index,), out, seen_nodes, ancestors)
