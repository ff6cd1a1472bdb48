#!/usr/bin/env bash
# The family vault at 135M, its pilots, read on training success only (`train/TASK/success_noexp`, `_exp`), never a
# held-out panel (none is played: --eval-every 0, no final evaluation). SmolLM2-135M-Instruct as actor, taught to
# follow a lesson first (--lesson-prior 25, as every mode of the comparison will be), 4 groups x 8, 300 iterations,
# seed 0. First F, the number of families, on GRPO's curve (neither solved by iteration 50 nor flat at 300: F = 6,
# results/family-smollm2/README.md); then MODE=oracle, the oracle's ceiling on that task (static with the scripted
# extractor: every lesson the door its episode showed), MODE=crl the method. REVEAL=1: the revealing form
# (vault-family6-reveal: a loss names its door too, so a family's first lesson can come from a loss). Resumable.
# Usage, from anywhere: [F=4|6|8] [MODE=grpo|oracle|crl] [REVEAL=1] bash runs/family-smollm2.sh [ROOT]
#   writes ROOT/family-smollm2/pilot/MODE-fF[-reveal]-seed0 (default ROOT: runs/rebuild)
set -euo pipefail
cd "$(dirname "$0")/.."
F=${F:-8} MODE=${MODE:-grpo} REVEAL=$([ "${REVEAL:-0}" = 1 ] && echo -reveal || true)
TASK=vault-family$([ "$F" = 8 ] || echo "$F")$REVEAL
OUT=${1:-runs/rebuild}/family-smollm2/pilot/$MODE-f$F$REVEAL-seed0
RESUME=$([ -e "$OUT/args.json" ] && echo --resume || true)
case $MODE in   # crl: the extractor's settings of the vault study (recipes.py VAULT_FIRST), its memory-only ones left
  oracle) FLAGS="--mode static --extractor oracle" ;;
  crl) FLAGS="--mode crl --extractor smollm2 --credit first-lift --extractor-none never --extractor-lr 3e-5
             --merge-every 0" ;;
  *) FLAGS="--mode $MODE --extractor smollm2" ;;
esac
python train.py --tasks "$TASK" --actor smollm2 $FLAGS --groups 4 --lesson-prior 25 \
    --iters 300 --eval-every 0 --final-eval-episodes 0 --save-every 30 --out "$OUT" $RESUME
