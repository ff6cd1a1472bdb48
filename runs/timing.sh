#!/usr/bin/env bash
# Rebuilds results/timing-memo/ (and results/timing/, the same command before the embedder's memo): one crl
# cell of the tiny room grid (seed 0, 120 iterations), timed alone; run it on an otherwise idle machine.
# Produced at 7fb4363 (timing/ at the commit before the memo), the algorithm before the release's defaults: the
# committed cell reproduced the grid's crl seed 0 bit for bit, which only a checkout of that code can do.
# Usage, from anywhere: bash runs/timing.sh [ROOT]   writes ROOT/timing-memo/ (default ROOT: runs/rebuild) and
# prints the wall time. About 15 minutes on 2 idle cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-runs/rebuild}

time python reproduce.py --results "$ROOT/timing-memo" --modes crl --seeds 1
