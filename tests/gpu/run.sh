#!/usr/bin/env bash
# The GPU checks of stagevisor, unattended, in a few minutes on a one-GPU machine that reaches no registry.
#
#   tests/gpu/run.sh                     # offline install from .whl/, then tests/gpu (Qwen3-TTS on a random
#                                        # checkpoint, fractions, CUDA handoffs) and the GPU vocoder benchmark
#   tests/gpu/run.sh --dry-run           # print exactly what it would run, run nothing
#   tests/gpu/run.sh --wheels DIR        # take the wheels from DIR instead of .whl/ at the repository root
#   tests/gpu/run.sh --fetch-wheels DIR  # on a networked machine: download tests/gpu/wheels.txt into DIR
#                                        # (CPython 3.12, manylinux x86_64; sox is built into a wheel)
#   tests/gpu/run.sh --rehearse DIR      # on this CPU machine: the closure check and the same offline install,
#                                        # for CPython 3.12, into a scratch folder; collects the tests with
#                                        # $PYTHON (one with the test dependencies), runs none
#
# The machine's python3 must have a CUDA build of torch and torchaudio (the image's). Nothing is fetched:
# the wheels in tests/gpu/wheels.txt (what the image lacks, or has at versions qwen-tts's pins exclude)
# go with `pip install --no-index --no-deps --target` into a scratch folder put first on PYTHONPATH, so
# transformers 4.57.3 shadows the image's 5.x for this run only; stagevisor installs there the same way.
# Output goes to stdout; exit status is pytest's, or the first failing step's.
set -euo pipefail
cd "$(dirname "$0")/../.."

DRY=0
WHEELS=.whl
FETCH=""
REHEARSE=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --wheels) WHEELS="$2"; shift ;;
    --fetch-wheels) FETCH="$2"; shift ;;
    --rehearse) REHEARSE="$2"; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "error: unknown option $1; see tests/gpu/run.sh --help" >&2; exit 2 ;;
  esac
  shift
done

PYTHON="${PYTHON:-python3}"
SITE="${SITE:-/tmp/stagevisor-gpu-site}"
# Together well under 10 minutes with the install (the Qwen3 test builds and loads its checkpoint twice).
TEST_TIMEOUT="${TEST_TIMEOUT:-420}"
BENCH_TIMEOUT="${BENCH_TIMEOUT:-90}"
WHEEL_PYTHON="${WHEEL_PYTHON:-3.12}"
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# What pytest runs here; --rehearse collects the same paths, so a moved test file fails CI, not a lent GPU's minutes.
TESTS=(tests/gpu tests/unit/dataplane/test_cuda_ipc.py tests/unit/worker/test_device_isolation.py)
mapfile -t WANTED < <(grep -v -e '^#' -e '^$' tests/gpu/wheels.txt)
BINARY=()   # everything with a wheel on the index
for spec in "${WANTED[@]}"; do [[ $spec == sox==* ]] || BINARY+=("$spec"); done
SDIST_ONLY=(sox==1.5.0)   # no wheel on the index: built here, pure Python

run() {
  printf '+'; printf ' %q' "$@"; printf '\n'
  if [[ $DRY == 0 ]]; then "$@"; fi
}

# pip install --no-index --no-deps --target: the offline install, here and on the GPU machine alike. Every carried
# wheel but setuptools, which only builds stagevisor (build_install) and must not shadow the image's at run time.
offline_install() {
  local target=$1 wheel; shift
  local wheels=()
  for wheel in "$WHEELS"/*.whl; do [[ $(basename "$wheel") == setuptools-* ]] || wheels+=("$wheel"); done
  run "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$target" "$@" "${wheels[@]}"
}

# stagevisor itself, built from this checkout in pip's isolated build environment with the setuptools carried in
# the wheel folder (nothing fetched; the image's setuptools may be too old for pyproject.toml's `license`).
build_install() {
  run "$PYTHON" -m pip install --quiet --no-index --find-links "$WHEELS" --no-deps --no-compile --no-cache-dir \
      --target "$1" .
}

if [[ -n "$FETCH" ]]; then
  run mkdir -p "$FETCH"
  run "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest "$FETCH" \
      --python-version "$WHEEL_PYTHON" --implementation cp "${PLATFORMS[@]}" "${BINARY[@]}"
  run "$PYTHON" -m pip wheel --quiet --no-deps --no-binary :all: --wheel-dir "$FETCH" "${SDIST_ONLY[@]}"
  run "$PYTHON" tests/gpu/check_wheels.py "$FETCH"
  exit 0
fi

if [[ -n "$REHEARSE" ]]; then
  WHEELS=$REHEARSE
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/stagevisor-rehearse.XXXXXX")
  trap 'rm -rf "$scratch"' EXIT
  run "$PYTHON" tests/gpu/check_wheels.py "$WHEELS"
  # The same install for the GPU machine's interpreter: pip checks each wheel's tags against CPython 3.12.
  offline_install "$scratch" --only-binary=:all: --python-version "$WHEEL_PYTHON" --implementation cp \
      "${PLATFORMS[@]}"
  build_install "$scratch"
  run "$PYTHON" -m pytest --collect-only -q -p no:cacheprovider "${TESTS[@]}"
  run "$PYTHON" -c "import pathlib, sys; found = {p.name.split('-')[0].lower() for p in pathlib.Path(sys.argv[1]).glob('*.dist-info')}; print(len(found), 'distributions installed offline:', ', '.join(sorted(found)))" "$scratch"
  exit 0
fi

if [[ $DRY == 1 ]]; then echo "# dry run: these commands would run, in $(pwd)"; fi
if [[ $DRY == 0 ]] && ! compgen -G "$WHEELS/*.whl" >/dev/null; then
  echo "error: no wheels in $WHEELS; on a networked machine run tests/gpu/run.sh --fetch-wheels $WHEELS" >&2
  exit 2
fi

run nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
run "$PYTHON" -c "import torch, torchaudio; assert torch.cuda.is_available(), 'torch sees no CUDA device'; print('torch', torch.__version__, 'torchaudio', torchaudio.__version__, torch.cuda.get_device_name(0))"
run "$PYTHON" tests/gpu/check_wheels.py "$WHEELS"
run rm -rf "$SITE"
offline_install "$SITE"
build_install "$SITE"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
echo "+ export PYTHONPATH=$PYTHONPATH"
run "$PYTHON" -c "import transformers, qwen_tts, google.protobuf, grpc, stagevisor.supervisor.cli; assert transformers.__version__ == '4.57.3', transformers.__version__; print('transformers', transformers.__version__, 'protobuf', google.protobuf.__version__, 'grpcio', grpc.__version__)"
# A qwen3 package that fails to import fails its tests here instead of skipping them (tests/markers.py).
export STAGEVISOR_REQUIRE_QWEN3=1
echo "+ export STAGEVISOR_REQUIRE_QWEN3=1"
status=0
run timeout "$TEST_TIMEOUT" "$PYTHON" -m pytest -q -rs --durations=10 -p no:cacheprovider "${TESTS[@]}" || status=$?
# The benchmark runs even when a test failed: its numbers still say something.
run timeout "$BENCH_TIMEOUT" "$PYTHON" tests/gpu/bench_gpu_vocoder.py --requests 16 \
    || { rc=$?; if [[ $status == 0 ]]; then status=$rc; fi; }
run nvidia-smi --query-gpu=memory.used --format=csv || true
exit "$status"
