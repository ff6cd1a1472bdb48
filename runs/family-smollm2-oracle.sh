#!/usr/bin/env bash
# The family vault at 135M, its second pilot: the oracle's ceiling on vault-family6 (F = 6, chosen on GRPO's training
# curve, pilot/grpo-f6-seed0). static with the scripted extractor (every lesson the door a won episode showed), the
# settings of the GRPO pilot otherwise: SmolLM2-135M-Instruct as actor, --lesson-prior 25, 4 groups x 8, seed 0.
# Read on training success with lessons against GRPO's without (`train/vault-family6/success_exp`, `_noexp`), never
# a held-out panel (none is played). Resumable (a checkpoint every 30 iterations): run it again to continue.
# Usage, from anywhere: bash runs/family-smollm2-oracle.sh [ROOT]   writes ROOT/family-smollm2/ (default: runs/rebuild)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/rebuild}/family-smollm2/pilot/oracle-f6-seed0
RESUME=$([ -e "$OUT/args.json" ] && echo --resume || true)
python train.py --tasks vault-family6 --actor smollm2 --mode static --extractor oracle --groups 4 --lesson-prior 25 \
    --iters ${ITERS:-300} --eval-every 0 --final-eval-episodes 0 --save-every 30 --out "$OUT" $RESUME
