#!/usr/bin/env bash
# Its options (--lesson-sets, --query-map, --recent-moves) were retired after beda864: run this script in a checkout
# of beda864 or of the commit named below (git worktree add ../crl-beda864 beda864).
# Rebuilds results/probe-maze/: crl and grpo x 3 seeds on maze with every tiny lesson setting at once (3-move
# plans, the last 3 moves in view, 32 training instances, the map in the retrieval key), 120 iterations.
# Produced at 5fd2a7d (seed 0) and c606302 (seeds 1-2), the algorithm before the release's defaults: to get the
# committed numbers, run this script in a checkout of that code.
# Usage, from anywhere: bash runs/probe-maze.sh [ROOT]   writes ROOT/probe-maze/ (default ROOT: runs/rebuild;
# ROOT `results` resumes the committed record). About 2 hours on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-runs/rebuild}

python reproduce.py --tasks maze --modes grpo,crl --seeds 3 --results "$ROOT/probe-maze" -- --iters 120 \
    --lesson-moves 3 --recent-moves 3 --train-instances 32 --query-map
