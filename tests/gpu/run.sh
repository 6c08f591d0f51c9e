#!/usr/bin/env bash
# The GPU checks of stagevisor, unattended, in a few minutes on a one-GPU machine.
#
#   tests/gpu/run.sh                     # set up .venv-gpu, run tests/gpu, run the GPU benchmark
#   tests/gpu/run.sh --dry-run           # print exactly what it would run, run nothing
#   tests/gpu/run.sh --wheelhouse DIR    # install missing packages from DIR only (a machine without network)
#   tests/gpu/run.sh --fetch-wheels DIR  # on a networked machine: download those wheels into DIR
#                                        # (for Python $WHEEL_PYTHON, default 3.12, manylinux x86_64)
#
# The machine's own python3 must have a CUDA build of torch: the venv is made with
# --system-site-packages so that torch is used as is, and only what it lacks (the
# project's own dependencies, nvidia-ml-py) is installed. Output goes to stdout;
# exit status is pytest's, or the first failing step's.
set -euo pipefail
cd "$(dirname "$0")/../.."

DRY=0
WHEELHOUSE=""
FETCH=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --wheelhouse) WHEELHOUSE="$2"; shift ;;
    --fetch-wheels) FETCH="$2"; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "error: unknown option $1; see tests/gpu/run.sh --help" >&2; exit 2 ;;
  esac
  shift
done

PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv-gpu}"
# Together under 5 minutes with the setup.
TEST_TIMEOUT="${TEST_TIMEOUT:-180}"
BENCH_TIMEOUT="${BENCH_TIMEOUT:-90}"
# The project's runtime dependencies plus what the GPU tests add; torch comes from the system.
PACKAGES=(pydantic PyYAML grpcio grpcio-health-checking grpcio-reflection protobuf numpy psutil pytest nvidia-ml-py)

run() {
  printf '+'; printf ' %q' "$@"; printf '\n'
  if [[ $DRY == 0 ]]; then "$@"; fi
}

if [[ -n "$FETCH" ]]; then
  run mkdir -p "$FETCH"
  run "$PYTHON" -m pip download --dest "$FETCH" --only-binary=:all: \
      --python-version "${WHEEL_PYTHON:-3.12}" --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
      "${PACKAGES[@]}"
  exit 0
fi

if [[ $DRY == 1 ]]; then echo "# dry run: these commands would run, in $(pwd)"; fi
PIP_SOURCE=()
if [[ -n "$WHEELHOUSE" ]]; then PIP_SOURCE=(--no-index --find-links "$WHEELHOUSE"); fi

run nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
run "$PYTHON" -m venv --system-site-packages "$VENV"
run "$VENV/bin/python" -c "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA device'; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
run "$VENV/bin/python" -m pip install --quiet "${PIP_SOURCE[@]}" "${PACKAGES[@]}"
run "$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e .
status=0
run timeout "$TEST_TIMEOUT" "$VENV/bin/python" -m pytest -q -rs -p no:cacheprovider \
    tests/gpu tests/unit/test_cuda_ipc.py tests/unit/test_device_isolation.py || status=$?
# The benchmark runs even when a test failed: its numbers still say something.
run timeout "$BENCH_TIMEOUT" "$VENV/bin/python" tests/gpu/bench_gpu_vocoder.py --requests 16 \
    || { rc=$?; if [[ $status == 0 ]]; then status=$rc; fi; }
run nvidia-smi --query-gpu=memory.used --format=csv || true
exit "$status"
