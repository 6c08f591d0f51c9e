"""Where workers import stage factories from, a check that each can be found before any worker starts, and why one
that cannot be imported failed (its own module missing, or an import inside it).

uvicorn and gunicorn find a user's application in the directory they work in
(`--app-dir`); stagevisor does the same for factories: the `--app-dir`
directories, then the directory of the YAML config, then the directory
`serve` runs in, ahead of the installed packages, but only after the worker
imported stagevisor itself, which none of them can replace (worker/fork_server.py,
`python -m stagevisor` in supervisor/_root/__main__.py). Finding a module here
executes none of its code (no package `__init__` runs), so the daemon never
imports a user's stages, or torch through them.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib.machinery
import importlib.util
import pkgutil
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from stagevisor.supervisor.errors import ErrorCode


def app_dir(value: str) -> str:
    """argparse type of --app-dir: an existing directory. A mistyped one would only show later, as a factory that
    cannot be found with no word about the directory it was meant to come from."""
    path = Path(value).expanduser()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value!r} is {'not a directory' if path.exists() else 'not there'}")
    return value


def add_app_dir_option(parser: argparse.ArgumentParser) -> None:
    """--app-dir, as `plan`, `check` and `serve` take it: one declaration, so it reads the same in each."""
    parser.add_argument(
        "--app-dir",
        type=app_dir,
        action="append",
        default=[],
        metavar="DIR",
        help="a directory to find stage factories' modules in, ahead of the YAML config's directory and the current "
        "directory (both searched by default); repeatable",
    )


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
    """A stage's factory whose module cannot be imported, and why: its `code` says which case it is.

    MODULE_NOT_FOUND: the module is not on the import path (a typo in `module:callable`, or a package
    where serve does not look); `searched` lists where it looked, `suggestion` a close name found there.
    MISSING_DEPENDENCY: the module was found, but importing it (or calling its factory) failed on an
    import of its own; `missing` is the module that import named, `detail` the ImportError's words and
    `location` the file and line of the import.
    """

    stage: str
    factory: str
    module: str
    searched: tuple[str, ...] = ()
    suggestion: str | None = None
    missing: str = ""
    detail: str = ""
    location: str = ""

    @property
    def code(self) -> ErrorCode:
        return ErrorCode.MISSING_DEPENDENCY if self.detail else ErrorCode.MODULE_NOT_FOUND

    def reason(self, remedy: str = "") -> str:
        """Which import failed and what to do: `factory 'm:f' cannot be imported: <reason>`; `remedy` replaces
        the advice for a module not found (what to do where the import path is another's, as apply's is)."""
        if self.detail:
            where = f" (at {self.location})" if self.location else ""
            if self.missing.partition(".")[0] == self.module.partition(".")[0]:
                todo = f"{self.missing!r} is in the stage's own package: fix that import, or add the module"
            elif self.missing and self.detail.startswith("No module named"):
                todo = (
                    f"install the package that provides {self.missing.partition('.')[0]!r} in the environment "
                    "the workers run in, or fix that import"
                )
            else:
                todo = "install what that import needs (the version the module expects), or fix that import"
            return f"module {self.module!r} was found, but an import failed: {self.detail}{where}; {todo}"
        where = ", ".join(self.searched[:6]) + (", ..." if len(self.searched) > 6 else "")
        close = f"; did you mean {self.suggestion!r}?" if self.suggestion else ""
        remedy = remedy or (
            "check the module name in the stage's `factory`, run `stagevisor serve` from the directory that holds "
            "the package, put it next to the YAML config, or pass --app-dir DIR"
        )
        return f"no module {self.module!r} on the import path (searched: {where}){close}; {remedy}"

    def message(self, remedy: str = "") -> str:
        return f"stage {self.stage!r}: factory {self.factory!r} cannot be imported: {self.reason(remedy)}"

    def line(self) -> str:
        """`CODE: message`, as serve, plan and check print it."""
        return f"{self.code.value}: {self.message()}"


CLOSE_ENOUGH = 0.7
"""How alike (difflib's ratio) a module's name must be to the one a factory names to be offered as its typo: at
difflib's default, 0.6, `myvoc` was offered the standard library's `pydoc`."""


def close_module(module: str, search: Sequence[str]) -> str | None:
    """A module on `search` whose dotted name is close to `module` (what a typo meant), found without importing.

    Walks directories, as `module_findable` does, so namespace packages (no `__init__.py`) count too.
    """
    parts = module.split(".")
    locations = [str(entry) for entry in search]
    fixed: list[str] = []
    for part in parts:
        names = _names_in(locations)
        if part not in names:
            close = difflib.get_close_matches(part, sorted(names), n=1, cutoff=CLOSE_ENOUGH)
            if not close:
                return None
            part = close[0]
        fixed.append(part)
        locations = [str(Path(entry) / part) for entry in locations if (Path(entry) / part).is_dir()]
        if not locations:
            break  # a plain module holds no submodules
    suggestion = ".".join(fixed)
    return suggestion if len(fixed) == len(parts) and suggestion != module else None


def _names_in(locations: Sequence[str]) -> set[str]:
    """Modules and packages (namespace packages too) directly in `locations`."""
    names = {info.name for info in pkgutil.iter_modules(list(locations))}
    for entry in locations:
        with contextlib.suppress(OSError):
            names.update(d.name for d in Path(entry).iterdir() if d.name.isidentifier() and d.is_dir())
    return names


def import_failure(stage: str, factory: str, error: BaseException, search: Sequence[str]) -> UnimportableFactory | None:
    """Which import failed, when importing `factory` or calling it raised `error`; None when it is no ImportError.

    The factory's own module (or a package above it) missing is MODULE_NOT_FOUND; any other import
    failing, in that module or in the factory, is MISSING_DEPENDENCY.
    """
    if not isinstance(error, ImportError):
        return None
    module = factory.partition(":")[0]
    name = error.name or ""
    if isinstance(error, ModuleNotFoundError) and name and (module == name or module.startswith(f"{name}.")):
        searched = tuple(dict.fromkeys(entry or "." for entry in search))
        return UnimportableFactory(stage, factory, module, searched, close_module(module, searched))
    return UnimportableFactory(stage, factory, module, missing=name, detail=str(error), location=_import_site(error))


def _import_site(error: BaseException) -> str:
    """`file:line` of the innermost frame outside the import machinery: the import statement that failed."""
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if not frame.filename.startswith("<frozen ") and not frame.filename.endswith(_IMPORTLIB_INIT)
    ]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""


_IMPORTLIB_INIT = str(Path("importlib") / "__init__.py")


def unimportable_factories(stages: Iterable[tuple[str, str | None]], paths: Sequence[str]) -> list[UnimportableFactory]:
    """For (stage, factory) pairs, the factories whose module cannot be found on `paths` + sys.path."""
    search = [*paths, *(entry or "." for entry in sys.path)]
    missing = []
    for stage, factory in stages:
        if not factory:
            continue
        module = factory.partition(":")[0]
        if not module_findable(module, search):
            searched = tuple(dict.fromkeys(search))
            missing.append(UnimportableFactory(stage, factory, module, searched, close_module(module, searched)))
    return missing
