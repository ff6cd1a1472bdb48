#!/usr/bin/env bash
# Rebuilds results/room/, results/room.md and results/room.png: the tiny models' room grid (crl, grpo, static,
# exp-only, no-split x 3 seeds, 120 iterations, 256 held-out episodes each way at the end).
# Produced at 1a607c9 and the commits after it up to ef143b0 (one cell a commit; no-split seed 1's last 30
# iterations and the seed-2 cells of static, exp-only and no-split after the causal prefill), the algorithm
# before the release's defaults: to get the committed numbers, run this script in a checkout of that code.
# Usage, from anywhere: bash runs/room.sh [ROOT]   writes ROOT/room/, ROOT/room.md, ROOT/room.png (default ROOT:
# runs/rebuild; ROOT `results` resumes the committed record). About 4-5 hours on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-runs/rebuild}

python reproduce.py --results "$ROOT"
