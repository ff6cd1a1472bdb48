#!/usr/bin/env bash
# Rebuilds results/gpu/: the GPU checks and figures, on one CUDA GPU (H200 on 2026-11-26 and 2026-11-28; the files say
# which code each call ran, the last one a92209f). MiniHack and NLE must be installed for the two training tests.
# Usage, from anywhere: bash runs/gpu.sh [ROOT]   writes ROOT/gpu/ (default ROOT: runs/rebuild). About 3 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-runs/rebuild}
OUT=$ROOT/gpu
mkdir -p "$OUT"
python -m pytest -q tests/test_gpu.py 2>&1 | tail -3 > "$OUT/tests.txt" || true
python bench.py gpu > "$OUT/bench.txt"
python bench.py kernels > "$OUT/kernels.txt"   # the kernels against torch; decode attention at 2-8k positions against its roof
python -m probes.gpu_profile > "$OUT/profile.txt"
