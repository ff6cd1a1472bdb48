#!/usr/bin/env bash
# Rebuilds results/cispo-none/: does the follower's play after a win decide whether CISPO drains the extractor's
# NONE after a loss and collapses it onto one door (results/vault-clean: crl seeds 1-3 wrote a lesson after every
# episode from iteration 50)? The CISPO probe (probes/vault/cispo_vault.py) with the grid's extractor settings
# (--extractor-none failure --credit lift --extractor-lr 3e-5), 3 of 8 vaults won, and a lost vault's lesson
# played as the trained actor plays it (--p-follow 0.73: its old first door, then the lesson's). Two arms that
# differ only in what the follower does with a won vault:
#   habit     the actor of crl seeds 0, 2, 3: wins it again 0.99 without a lesson, 0.94 with a wrong one
#   sampling  the actor of crl seed 4: wins it again 0.65 without a lesson (controls/crl-seed4.txt), 0.42 with a
#             wrong one (training, last third); both 0.99 with the right one
# results/cispo-none ran on the 2-core Xeon (AVX-512 BF16), alone, on the code of the commit that added this script.
# Usage, from anywhere: bash runs/cispo-none.sh [ROOT]   (default ROOT: runs/rebuild)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/rebuild}/cispo-none
COMMON="--steps ${STEPS:-30} --p-won 0.375 --p-follow 0.73 --p-right 0.99"
FLAGS="--extractor-none failure --credit lift --extractor-lr 3e-5 --embedder smollm2"
[ -f "$OUT/habit/curve.jsonl" ] ||
    python -m probes.vault.cispo_vault --out "$OUT/habit" $COMMON --p-wrong 0.94 --p-again 0.99 $FLAGS
[ -f "$OUT/sampling/curve.jsonl" ] ||
    python -m probes.vault.cispo_vault --out "$OUT/sampling" $COMMON --p-wrong 0.42 --p-again 0.65 $FLAGS
python -m probes.vault.cispo_vault --plot "$OUT"
