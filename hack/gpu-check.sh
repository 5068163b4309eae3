#!/usr/bin/env bash
# The GPU check (`make gpu-check`): the textbook case on this machine's accelerator, then the
# GPU-marked tests of the torch engine and of the check. Results (JSON, PNG, logs) in $1.
#
# It runs from the source tree, with the first Python that has PyTorch: the project's venv, or
# the machine's own (a GPU machine with CUDA PyTorch, torchvision, onnxruntime, nvidia-ml-py,
# uvloop, prometheus-client and grpcio, but not the project's other dependencies). Those others
# travel as wheels made beforehand on a machine with an index (`hack/gpu-check.sh wheels`, into
# build/gpu-wheels) and are installed here into build/gpu-site, never into the system.
#
#   hack/gpu-check.sh wheels          # here, with network: the wheels for CPython 3.10-3.13
#   hack/gpu-check.sh [RESULTS_DIR]   # there: the check and `pytest -m gpu`
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=build/gpu-wheels
SITE=build/gpu-site
# What the runtime, the load generator and pytest need beyond what the GPU machine has.
NEEDED=(fastapi uvicorn httptools orjson aiohttp pydantic pydantic-settings pytest)

if [ "${1:-}" = wheels ]; then
    PIP=${PIP:-.venv/bin/pip}
    mkdir -p "$WHEELS"
    for version in 3.10 3.11 3.12 3.13; do
        "$PIP" download --quiet --only-binary=:all: --dest "$WHEELS" \
            --python-version "$version" --platform manylinux2014_x86_64 \
            --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
            "${NEEDED[@]}"
    done
    du -sh "$WHEELS"
    exit 0
fi

OUT=${1:-gpu-check-results}
PYTHON=${GPU_CHECK_PYTHON:-}
if [ -z "$PYTHON" ]; then
    for candidate in .venv/bin/python python3 python; do
        if command -v "$candidate" >/dev/null && "$candidate" -c 'import torch' 2>/dev/null; then
            PYTHON=$candidate
            break
        fi
    done
fi
if [ -z "$PYTHON" ]; then
    echo "gpu-check: no Python here has PyTorch: make install (the CPU build), or a machine with CUDA PyTorch" >&2
    exit 2
fi
export PYTHONPATH="$PWD/api:$PWD/runtime:$PWD/operator:$PWD/tools${PYTHONPATH:+:$PYTHONPATH}"
probe='import fastapi, uvicorn, httptools, orjson, aiohttp, pydantic_settings, pytest'
if ! "$PYTHON" -c "$probe" 2>/dev/null; then
    if [ ! -d "$WHEELS" ]; then
        echo "gpu-check: $PYTHON lacks the runtime's dependencies and there is no $WHEELS: make them where an index is reachable with 'hack/gpu-check.sh wheels' and bring build/gpu-wheels along" >&2
        exit 2
    fi
    "$PYTHON" -m pip install --quiet --no-index --find-links "$WHEELS" --target "$SITE" "${NEEDED[@]}"
    export PYTHONPATH="$PYTHONPATH:$PWD/$SITE"
fi

if "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu-check: CUDA is here: ResNet-50 (or its stand-in without torchvision) on the GPU"
    extra=()
else
    echo "gpu-check: NO GPU here (PyTorch sees no CUDA device): the whole check runs on the CPU with a tiny model, to prove it runs; its numbers say nothing about a GPU"
    extra=(--quick --intra-op-threads 1)
fi
status=0
"$PYTHON" -m batchpilot.gpucheck --out "$OUT" "${extra[@]}" || status=$?
# The GPU-marked tests; without onnx and the shared fixtures, which the GPU machine lacks.
"$PYTHON" -m pytest --noconftest -p no:cacheprovider -m gpu -q -rs \
    tests/test_torch_engine.py tests/test_gpu_check.py || status=$?
exit $status
