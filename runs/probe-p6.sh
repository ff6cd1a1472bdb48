#!/usr/bin/env bash
# Its options (--lesson-sets, --query-map, --recent-moves) were retired after beda864: run this script in a checkout
# of beda864 or of the commit named below (git worktree add ../crl-beda864 beda864).
# Rebuilds results/probe-p6/ (probe p6 in results/probes.md): can CISPO teach the tiny extractor? exp-only on
# room after a 300-step lesson-following prior, one-word lessons, an 8-instance pool keyed by the map; each
# run trained (learn) and with the extractor frozen by --extractor-lr 0 (frozen), seeds 0 and 1, 100
# iterations; then seed 0 for 300 iterations, with and without NONE in the extractor's heads.
# Produced at 8312e91 (learn, frozen), 2eca17b and 459be92 (seed 1), c6f0857 (learn-300) and 5fc7b7a
# (learn-300-no-none), the algorithm before the release's defaults: to get the committed numbers, run this
# script in a checkout of that code.
# Usage, from anywhere: bash runs/probe-p6.sh [ROOT]   writes ROOT/probe-p6/ (default ROOT: runs/rebuild).
# About 15 minutes a 100-iteration run on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-runs/rebuild}
OUT=$ROOT/probe-p6
p6=(--tasks room --mode exp-only --lesson-prior 300 --lesson-moves 1 --query-map --train-instances 8
    --bank-capacity 64 --extractor-batch 16 --eval-every 0)

python train.py "${p6[@]}" --iters 100 --seed 0 --out "$OUT/learn"
python train.py "${p6[@]}" --iters 100 --seed 0 --extractor-lr 0 --out "$OUT/frozen"
python train.py "${p6[@]}" --iters 100 --seed 1 --out "$OUT/learn-seed1"
python train.py "${p6[@]}" --iters 100 --seed 1 --extractor-lr 0 --out "$OUT/frozen-seed1"
python train.py "${p6[@]}" --iters 300 --seed 0 --out "$OUT/learn-300"
python train.py "${p6[@]}" --iters 300 --seed 0 --extractor-none never --out "$OUT/learn-300-no-none"
