#!/usr/bin/env bash
# Its options (--lesson-sets, --query-map, --recent-moves) were retired after beda864: run this script in a checkout
# of beda864 or of the commit named below (git worktree add ../crl-beda864 beda864).
# Rebuilds results/smollm2-plan2/: crl x 3 seeds on room with 2-move plans as lessons, retrieved by a key that
# holds the map (--lesson-moves 2 --query-map), then the lesson-following probe on each trained actor.
# Produced at a7c46e3 (the grid) and 7d2f199 (lesson-follow), the algorithm before the release's defaults: to
# get the committed numbers, run this script in a checkout of that commit.
# Usage, from anywhere: bash runs/smollm2-plan2.sh [ROOT]   writes ROOT/smollm2-plan2/ (default ROOT:
# runs/rebuild; ROOT `results` resumes the committed record). About 1 hour on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-runs/rebuild}
OUT=$ROOT/smollm2-plan2

python reproduce.py --results "$OUT" --modes crl --seeds 3 --iters 60 -- --actor smollm2 --extractor smollm2 \
    --lesson-moves 2 --query-map
mkdir -p "$OUT/lesson-follow"
for seed in 0 1 2; do
    python -m probes.lesson_follow --run "$OUT/room/crl-seed$seed" --starts 16 > "$OUT/lesson-follow/crl-seed$seed.txt"
done
