"""The config's `voices` map against the model's declared voices: which entries name no voice of the model, and
what an apply of a config changes. Pure data: the daemon (an apply), the admin API, the CLI and the HTTP API all
read it, so it sits below them all."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence


def declared_names(voices: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Every id and alias of the model's declared voices -> the voice's id."""
    names: dict[str, str] = {}
    for voice in voices:
        voice_id = str(voice.get("id", ""))
        names.setdefault(voice_id, voice_id)
        for alias in voice.get("aliases", ()) or ():
            names.setdefault(str(alias), voice_id)
    return names


@dataclass(frozen=True)
class VoiceNamesChange:
    """The config's `voices` map before and after an apply of a config (a name clients send -> the model's voice),
    with a line for each entry that names a voice the model does not have (`unknown_voice_targets`)."""

    before: Mapping[str, str]
    after: Mapping[str, str]
    unknown: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return dict(self.before) != dict(self.after)

    def lines(self) -> list[str]:
        """One line per name: `+` added, `-` removed, `~` standing for another voice."""
        before, after = self.before, self.after
        lines = [f"+ {name} -> {after[name]}" for name in after if name not in before]
        lines += [f"- {name} (stood for {before[name]})" for name in before if name not in after]
        lines += [
            f"~ {name} -> {after[name]} (was {before[name]})"
            for name in after
            if name in before and before[name] != after[name]
        ]
        return lines

    def render(self) -> str:
        if not self.changed:
            return "voices: no change"
        return "voices (the config's map of names clients may send):\n" + "\n".join(
            f"  {line}" for line in self.lines()
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "changed": self.changed,
            "before": dict(self.before),
            "after": dict(self.after),
            "unknown": list(self.unknown),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "VoiceNamesChange":
        """The inverse of to_json (the CLI reads the daemon's answer back)."""
        return cls(dict(data["before"]), dict(data["after"]), tuple(data["unknown"]))


def unknown_voice_targets(voices: Sequence[Mapping[str, Any]], overrides: Mapping[str, str]) -> list[str]:
    """What is wrong with the config's `voices` entries that stand for a voice the model does not have, a line each
    for the operator (requests for such a name get 400 voice_not_found); none for a model that declares no voices."""
    declared = declared_names(voices)
    if not declared:
        return []
    known = ", ".join(repr(str(v.get("id", ""))) for v in voices)
    return [
        f"the config's `voices` maps {name!r} onto {target!r}, which is not a voice of the model (its voices: "
        f"{known}); requests for {name!r} get 400 voice_not_found until that entry names one of them"
        for name, target in overrides.items()
        if declared_spelling(target, declared) not in declared
    ]


def declared_spelling(target: str, declared: Mapping[str, str]) -> str:
    """`target` as the model declares it: a voice name in another case is the model's name for it (as a request's
    voice is read), anything else unchanged."""
    if target in declared:
        return target
    folded = {name.casefold(): name for name in declared}
    return folded.get(target.casefold(), target)
