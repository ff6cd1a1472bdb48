#!/usr/bin/env bash
# Rebuilds results/probe-actor/ (probe p7 in results/probes.md): how fast the tiny actor learns. grpo x 3 seeds
# with 4 PPO steps an iteration (mb4), grpo seed 0 at lr 1e-3 (lr1e-3), both 120 iterations as the room grid,
# and the default crl run with 4 PPO steps an iteration (default-mb4, 270 iterations).
# Produced at 596f7f9, the algorithm before the release's defaults: to get the committed numbers, run this
# script in a checkout of that commit.
# Usage, from anywhere: bash runs/probe-actor.sh [ROOT]   writes ROOT/probe-actor/ (default ROOT: runs/rebuild;
# ROOT `results` resumes the committed record). About 1.5 hours on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-runs/rebuild}
OUT=$ROOT/probe-actor

python reproduce.py --results "$OUT/mb4" --modes grpo -- --minibatches 4
python reproduce.py --results "$OUT/lr1e-3" --modes grpo --seeds 1 -- --lr 1e-3
python train.py --tasks room --minibatches 4 --final-eval-episodes 256 --out "$OUT/default-mb4"
