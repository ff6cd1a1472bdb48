#!/usr/bin/env bash
# Rebuilds results/vault-baseline/pilot/: does the extractor win the race on the clean vault when a CISPO advantage
# is the lift itself (--extractor-baseline none) instead of its distance from the batch mean? The pilot of
# results/vault-head/credit-trace's finding, on training metrics alone: exp-only (the untrained actor frozen, as in
# crl's head start: their first 150 iterations are equal value for value) on the seeds where the head start lost the
# race with the batch mean (crl seeds 1 and 2 of results/vault-head), 150 iterations, no held-out evaluation; read
# lessons right by block of 30 (`python reproduce.py --tasks vault --race RUN`) against those crl cells' first 150.
# Usage, from anywhere: bash runs/vault-baseline.sh [ROOT] [SEEDS]   writes ROOT/vault-baseline/pilot/none-seedK
# (default ROOT: runs/rebuild; SEEDS default "1 2"). A run with a checkpoint resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-runs/rebuild}
SEEDS=${2:-"1 2"}
for k in $SEEDS; do
    out=$ROOT/vault-baseline/pilot/none-seed$k
    resume=""; [ -f "$out/args.json" ] && resume=--resume
    python train.py --tasks vault --mode exp-only --seed "$k" --iters 150 --final-eval-episodes 0 --final-attempts 0 \
        --out "$out" --actor smollm2 --extractor smollm2 --instance-visits 4 --groups 4 --bank-min-cosine 0.999 \
        --extractor-none failure --credit lift --merge-every 0 --extractor-lr 3e-5 --extractor-baseline none \
        $resume
done
