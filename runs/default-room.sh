#!/usr/bin/env bash
# Rebuilds results/default-room/: the default run (tiny models, room, 270 iterations) with 256 held-out
# episodes each way at the end.
# Produced at 4fcb2a9 (the release's defaults, as the current code runs them).
# Usage, from anywhere: bash runs/default-room.sh [ROOT]   writes ROOT/default-room/ (default ROOT: runs/rebuild).
# About 30 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-runs/rebuild}

torchrun --nproc_per_node 1 train.py --tasks room --final-eval-episodes 256 --out "$ROOT/default-room"
