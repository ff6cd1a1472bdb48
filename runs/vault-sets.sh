#!/usr/bin/env bash
# Its options (--lesson-sets, --query-map, --recent-moves) were retired after beda864: run this script in a checkout
# of beda864 or of the commit named below (git worktree add ../crl-beda864 beda864).
# Rebuilds results/vault-sets/: crl on the clean vault of runs/vault-clean.sh with lessons that are sets of doors
# (--lesson-sets), so that a lesson written after a loss can name the doors the play left untried, and a lesson
# after every episode (--extractor-none never: allowed NONE after a loss, the untrained extractor takes it 0.975 of
# the time). Seed 0 only: does the trained actor gain through such lessons in the real loop? (results/cispo-sets:
# apart from the actor, CISPO collapses the extractor onto one constant set.)
# Usage, from anywhere: bash runs/vault-sets.sh [ROOT]   writes ROOT/vault-sets/ (default ROOT: runs/rebuild).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-runs/rebuild}
python reproduce.py --tasks vault --results "$ROOT/vault-sets" --modes crl --seeds 1 --iters ${ITERS:-300} -- \
    --actor smollm2 --extractor smollm2 --instance-visits 4 --groups 4 --bank-min-cosine 0.999 --extractor-none never \
    --lesson-sets --credit lift --merge-every 0 --extractor-lr 3e-5 --final-attempts 3
