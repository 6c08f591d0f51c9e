"""Check a folder of wheels for tests/gpu/run.sh's offline install: one version per name, every need met.

Each wheel's `Requires-Dist` and stagevisor's own dependencies (pyproject.toml),
markers evaluated for CPython 3.12 on Linux x86_64 and no extras, must be met
by a carried wheel or by a package of the GPU machine's image (IMAGE, with the
versions known from its pip list).
`--no-deps` installs skip this check, so without it a missing need shows up
only as an ImportError on the GPU, after minutes of device time.

    python tests/gpu/check_wheels.py .whl      # exit 1 with the unmet needs listed
"""

from __future__ import annotations

import argparse
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Iterable

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"

# The lent GPU machine's image ("cuda"): its Python packages, a version where its pip list gave one.
IMAGE: dict[str, str | None] = {
    name: None
    for name in (
        "anyio attrs certifi charset-normalizer click cloudpickle einops filelock fsspec h11 hf-xet httpcore httpx "
        "idna jinja2 joblib lazy-loader llvmlite markupsafe msgpack networkx numba nvidia-ml-py onnx packaging "
        "pandas pillow pip prometheus-client psutil pytest pyyaml regex requests rich scikit-learn scipy setuptools "
        "six sympy threadpoolctl tqdm typing-extensions urllib3 wheel"
    ).split()
}
IMAGE.update(
    {
        "torch": "2.11.0",
        "torchaudio": "2.11.0",
        "numpy": "2.5.2",
        "safetensors": "0.8.0",
        "onnxruntime": "1.30.0",
        "triton": "3.6.0",
    }
)
NOT_IMPORTED = {
    ("qwen-tts", "gradio"): "only qwen-tts's web demo (qwen_tts/cli/demo.py) imports gradio",
    ("stagevisor", "av"): "only HTTP's compressed formats and reference-audio uploads import PyAV; the GPU tests "
    "serve with --http none",
}
"""Needs a wheel declares for code this run never imports; skipped, with the reason."""
ENVIRONMENT = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "extra": "",
}


def applicable(lines: Iterable[str]) -> list[Requirement]:
    """The requirements among `lines` whose markers hold on the GPU machine (ENVIRONMENT)."""
    needs = [Requirement(line) for line in lines]
    return [need for need in needs if need.marker is None or need.marker.evaluate(ENVIRONMENT)]


def requirements(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(name).decode("utf-8"))
    return applicable(metadata.get_all("Requires-Dist") or ())


def own_requirements(pyproject: Path = PYPROJECT) -> list[Requirement]:
    """stagevisor's own needs: run.sh builds it from the checkout with --no-deps, so nothing else checks them."""
    return applicable(tomllib.loads(pyproject.read_text())["project"]["dependencies"])


def problems(folder: Path) -> list[str]:
    carried: dict[str, Version] = {}
    found: list[str] = []
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        return [f"no wheels in {folder}; run tests/gpu/run.sh --fetch-wheels {folder}"]
    for wheel in wheels:
        name, version, _, _ = parse_wheel_filename(wheel.name)
        if name in carried:
            found.append(f"two versions of {name}: {carried[name]} and {version}")
        carried[name] = version
    owners = [(parse_wheel_filename(wheel.name)[0], requirements(wheel)) for wheel in wheels]
    for owner, needs in [(canonicalize_name("stagevisor"), own_requirements()), *owners]:
        for need in needs:
            name = canonicalize_name(need.name)
            if (owner, name) in NOT_IMPORTED:
                continue
            if name in carried:
                if not need.specifier.contains(carried[name], prereleases=True):
                    found.append(f"{owner} needs {need}, carried {name} {carried[name]}")
            elif name in IMAGE:
                known = IMAGE[name]
                if known is not None and not need.specifier.contains(known, prereleases=True):
                    found.append(f"{owner} needs {need}, the image has {name} {known}: carry a wheel")
            else:
                found.append(f"{owner} needs {need}: neither carried nor in the image")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    found = problems(parser.parse_args().folder)
    for line in found:
        print(f"unmet: {line}", file=sys.stderr)
    print(f"{'FAILED' if found else 'ok'}: {len(found)} unmet needs")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
