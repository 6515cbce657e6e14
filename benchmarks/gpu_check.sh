#!/usr/bin/env bash
# The GPU check of the JAX engine, in one run of under 8 minutes on the GPU machine (one H200; JAX with CUDA,
# tensorboard, fsspec, tqdm, ml_dtypes; no TensorFlow, no network).
#
#   bash benchmarks/gpu_check.sh [WHEELS_DIR] [-- gpu_check.py options]
#   bash benchmarks/gpu_check.sh --help
#
# Installs the carried cp312 wheels of keras, optree and namex from WHEELS_DIR (default: wheels/) and ktrainer
# itself (editable, without dependencies) into the current Python, then runs benchmarks/gpu_check.py. Elsewhere,
# run it in a virtual environment; on a CPU (JAX_PLATFORMS=cpu) add `-- --tiny` (about 15 s).
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '2,10p' benchmarks/gpu_check.sh | sed 's/^# \{0,1\}//'; }
wheels=wheels
case "${1:-}" in
    -h | --help) usage; exit 0 ;;
    --) shift ;;
    "") ;;
    -*) echo "gpu_check.sh: unknown option $1 (options of gpu_check.py go after --)" >&2; usage >&2; exit 2 ;;
    *) wheels="$1"; shift; if [ "${1:-}" = "--" ]; then shift; fi ;;
esac
if [ -d "$wheels" ]; then
    pip install --no-index --no-deps "$wheels"/*.whl
fi
pip install --no-deps --no-build-isolation -e . >/dev/null 2>&1 || pip install --no-deps -e .
export KERAS_BACKEND=jax
python benchmarks/gpu_check.py "$@"
