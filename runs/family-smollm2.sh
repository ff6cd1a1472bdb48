#!/usr/bin/env bash
# The family vault at 135M, its first pilot: F on SmolLM2 GRPO's training curve. GRPO alone on vault-family (F = 8),
# SmolLM2-135M-Instruct as actor, taught to follow a lesson first (--lesson-prior 25, as every mode of the
# comparison will be), 4 groups x 8, 300 iterations; read on training success only (`train/vault-family/
# success_noexp`), never a held-out panel (none is played: --eval-every 0, no final evaluation). F stays 8 if it is
# neither solved by iteration 50 nor flat at 300; else vault-family4 or vault-family16. Resumable (a checkpoint
# every 30 iterations): run it again to continue.
# Usage, from anywhere: bash runs/family-smollm2.sh [ROOT]   writes ROOT/family-smollm2/ (default ROOT: runs/rebuild)
set -euo pipefail
cd "$(dirname "$0")/.."
F=${F:-8}   # F=4, F=6: the same pilot on vault-family4, vault-family6 (F = 6 chosen: README.md there)
TASK=vault-family$([ "$F" = 8 ] || echo "$F")
OUT=${1:-runs/rebuild}/family-smollm2/pilot/grpo-f$F-seed0
RESUME=$([ -e "$OUT/args.json" ] && echo --resume || true)
python train.py --tasks "$TASK" --actor smollm2 --extractor smollm2 --mode grpo --groups 4 --lesson-prior 25 \
    --iters 300 --eval-every 0 --final-eval-episodes 0 --save-every 30 --out "$OUT" $RESUME
