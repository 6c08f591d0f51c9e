"""Where workers import stage factories from, and a check that each factory can be found before any worker starts.

uvicorn and gunicorn find a user's application in the directory they work in
(`--app-dir`); stagevisor does the same for factories: the `--app-dir`
directories, then the directory of the YAML config, then the directory
`serve` runs in, ahead of the installed packages. Finding a module here
executes none of its code (no package `__init__` runs), so the daemon never
imports a user's stages, or torch through them.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence


def import_paths(
    app_dirs: Sequence[str | Path] = (), config: str | Path | None = None, cwd: str | Path | None = None
) -> tuple[str, ...]:
    """The directories a worker puts first on sys.path, in order, absolute, without repeats."""
    candidates = [*app_dirs, *([Path(config).parent] if config else []), cwd if cwd is not None else Path.cwd()]
    paths: list[str] = []
    for candidate in candidates:
        path = str(Path(candidate).expanduser().resolve())
        if path not in paths:
            paths.append(path)
    return tuple(paths)


def module_findable(module: str, search: Sequence[str]) -> bool:
    """True when `module` (dotted) is found on `search` without executing any code.

    Walks the package path one component at a time with the path-based finder,
    as `import` would, but loads nothing. Built-in and frozen modules count.
    """
    parts = module.split(".")
    if not all(part.isidentifier() for part in parts):
        return False
    if parts[0] in sys.modules:  # already imported here (stagevisor itself): importing parents runs nothing new
        return importlib.util.find_spec(module) is not None
    if importlib.machinery.PathFinder.find_spec(parts[0], list(search)) is None:
        # Not on a path entry: a built-in, or a package an import hook provides (an editable install);
        # its submodules cannot be checked without running its code, so the worker's import will tell.
        return importlib.util.find_spec(parts[0]) is not None
    locations: Sequence[str] | None = list(search)
    name = ""
    for part in parts:
        name = f"{name}.{part}" if name else part
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, locations)
        except KeyError:
            # A namespace package inside a namespace package (no __init__.py in either): the finder
            # wants the parent imported to build its path. Its portions are the directories named so.
            locations = [str(Path(entry) / part) for entry in locations or () if (Path(entry) / part).is_dir()]
            if not locations:
                return False
            continue
        if spec is None:
            return False
        locations = spec.submodule_search_locations
        if locations is None and name != module:
            return False  # a plain module cannot hold submodules
        locations = None if locations is None else list(locations)
    return True


@dataclass(frozen=True)
class UnimportableFactory:
    stage: str
    factory: str
    module: str
    searched: tuple[str, ...]

    def message(self) -> str:
        where = ", ".join(self.searched[:6]) + (", ..." if len(self.searched) > 6 else "")
        return (
            f"stage {self.stage!r}: factory {self.factory!r} cannot be imported: no module {self.module!r} "
            f"on the import path (searched: {where}); run `stagevisor serve` from the directory that holds "
            "the package, put it next to the YAML config, or pass --app-dir DIR"
        )


def unimportable_factories(stages: Iterable[tuple[str, str | None]], paths: Sequence[str]) -> list[UnimportableFactory]:
    """For (stage, factory) pairs, the factories whose module cannot be found on `paths` + sys.path."""
    search = [*paths, *(entry or "." for entry in sys.path)]
    missing = []
    for stage, factory in stages:
        if not factory:
            continue
        module = factory.partition(":")[0]
        if not module_findable(module, search):
            missing.append(UnimportableFactory(stage, factory, module, tuple(dict.fromkeys(search))))
    return missing
