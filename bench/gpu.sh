#!/usr/bin/env bash
# GPU throughput benchmark (docs/benchmarks.md, "GPU throughput"): resnet50 at 224 px with mixed precision, the trainer
# against a plain torchvision-reference-style loop, the GPU-resident cache on and off, and NVIDIA's published figure.
# Under 5 minutes on one GPU. Results: bench/results/gpu.json and the printed table.
#
#   bench/gpu.sh            on a machine with a CUDA GPU
#   bench/gpu.sh --smoke    the same steps on the CPU, tiny (the test suite runs this)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
exec "$PY" bench/gpu.py "$@"
