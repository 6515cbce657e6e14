#!/usr/bin/env bash
# The GPU check of the JAX engine, in one run of under 8 minutes on the GPU machine (one H200; JAX with CUDA,
# tensorboard, fsspec, tqdm, ml_dtypes; no TensorFlow, no network).
#
#   bash benchmarks/gpu_check.sh [WHEELS_DIR] [-- gpu_check.py options]
#
# Installs the carried cp312 wheels of keras, optree and namex from WHEELS_DIR (default: wheels/) and ktrainer
# itself without dependencies, then runs benchmarks/gpu_check.py. On a CPU (JAX_PLATFORMS=cpu) add `-- --tiny`.
set -euo pipefail
cd "$(dirname "$0")/.."
wheels="${1:-wheels}"
shift || true
[ "${1:-}" = "--" ] && shift
if [ -d "$wheels" ]; then
    pip install --no-index --no-deps "$wheels"/*.whl
fi
pip install --no-deps --no-build-isolation -e . >/dev/null 2>&1 || pip install --no-deps -e .
export KERAS_BACKEND=jax
python benchmarks/gpu_check.py "$@"
