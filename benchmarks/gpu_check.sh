#!/usr/bin/env bash
# The GPU check of the JAX engine, in one run of under 8 minutes on the GPU machine (one H200; JAX with CUDA,
# tensorboard, fsspec, tqdm, ml_dtypes; no TensorFlow, no network).
#
#   bash benchmarks/gpu_check.sh [WHEELS_DIR] [-- gpu_check.py options]
#   bash benchmarks/gpu_check.sh --help
#
# Installs the cp312 wheels in WHEELS_DIR (default: .whl/; keras, optree, namex, google-crc32c) into a private
# folder without touching the Python's own packages, runs ktrainer from this source tree, and runs
# benchmarks/gpu_check.py with $PYTHON (default python3). Fetch the wheels where there is a network with:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl keras optree namex google-crc32c
# On a CPU (JAX_PLATFORMS=cpu), with wheels for that Python, add `-- --tiny` (about 15 s).
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '2,13p' benchmarks/gpu_check.sh | sed 's/^# \{0,1\}//'; }
wheels=.whl
case "${1:-}" in
    -h | --help) usage; exit 0 ;;
    --) shift ;;
    "") ;;
    -*) echo "gpu_check.sh: unknown option $1 (options of gpu_check.py go after --)" >&2; usage >&2; exit 2 ;;
    *) wheels="$1"; shift; if [ "${1:-}" = "--" ]; then shift; fi ;;
esac
python="${PYTHON:-python3}"
site="$(mktemp -d -t ktrainer-gpu-check-site-XXXXXX)"
trap 'rm -rf "$site"' EXIT
if compgen -G "$wheels/*.whl" >/dev/null; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheels"/*.whl
else
    echo "gpu_check.sh: no wheels in $wheels; using the packages $python already has" >&2
fi
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}" KERAS_BACKEND=jax PYTHONUNBUFFERED=1
"$python" -c 'import jax, keras, ktrainer; print("ktrainer from", ktrainer.__file__)'
"$python" benchmarks/gpu_check.py "$@"
