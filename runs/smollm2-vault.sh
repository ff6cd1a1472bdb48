#!/usr/bin/env bash
# Rebuilds results/smollm2-vault/: the vault grid with SmolLM2 (4 modes x 5 seeds, 60 iterations, 16 training
# vaults, then 3 attempts at each held-out vault through a copy of the bank), and the two settings probes on
# seed 100, which is no grid seed.
# Produced at 8405555 (grid seed 0), f71e512 (grid seeds 1-4, the extractor-lr probe) and 079288d (the settings
# probe): the release's defaults, as the current code runs them.
# Usage, from anywhere: bash runs/smollm2-vault.sh [ROOT]   writes ROOT/smollm2-vault/ (default ROOT:
# runs/rebuild; ROOT `results` resumes the committed record, whose finished cells reproduce.py skips).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-runs/rebuild}
OUT=$ROOT/smollm2-vault

python train.py --tasks vault --actor smollm2 --extractor smollm2 --train-instances 16 --iters 30 --eval-every 0 \
    --seed 100 --out "$OUT/probe-seed100"
python train.py --tasks vault --actor smollm2 --extractor smollm2 --train-instances 16 --iters 40 --eval-every 0 \
    --seed 100 --extractor-lr 1e-4 --out "$OUT/probe-lr1e-4-seed100"
python reproduce.py --tasks vault --results "$OUT" --modes grpo,crl,static,exp-only --seeds 5 --iters 60 -- \
    --actor smollm2 --extractor smollm2 --train-instances 16 --final-attempts 3
