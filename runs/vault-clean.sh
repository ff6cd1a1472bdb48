#!/usr/bin/env bash
# Rebuilds results/vault-clean/: the vault as a clean control of co-evolution with SmolLM2 (4 modes x 5 seeds,
# then 3 attempts at each held-out vault through a copy of the bank), and the CISPO probe arm that chose its
# extractor learning rate (a step of 16 fresh won vaults, the follower at the untrained actor's controls).
# What makes it clean, each chosen on the probe or on training metrics, never on the evaluation seeds:
#   --instance-visits 4      fresh vaults, each played 4 iterations in a row and retired: they recur, so a lesson
#                            can be read back, but are never learned into the actor's weights
#   --bank-min-cosine 0.999  a vault reads only its own lessons (none on its first visit), not another vault's door
#   --extractor-none failure a won episode must yield a lesson (the door), a lost one may yield none
#   --credit lift            a lesson is credited with its episode's gain over the same vault played without one
#   --merge-every 0          the one-lesson merge of the small heads folds five vaults' doors into one
#   --extractor-lr 3e-5      the probe arm: P(opened door) 0.09 -> 0.47 -> 0.99 at steps 0, 10, 20, no collapse
#                            (1e-5, the preset, took 70-80 steps in results/cispo-vault; 1e-4 collapsed)
# Usage, from anywhere: bash runs/vault-clean.sh [ROOT]   writes ROOT/vault-clean/ (default ROOT: runs/rebuild;
# ROOT `results` resumes the committed record, whose finished cells reproduce.py skips).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-runs/rebuild}
OUT=$ROOT/vault-clean
CLEAN="--instance-visits 4 --groups 4 --bank-min-cosine 0.999 --extractor-none failure --credit lift --merge-every 0"

[ -f "$OUT/probe-real-won-lr3e-5/curve.jsonl" ] ||
    python -m probes.vault.cispo_vault --out "$OUT/probe-real-won-lr3e-5" --steps 20 --p-won 1 --p-right 0.61 \
        --p-wrong 0.15 --extractor-lr 3e-5 --embedder smollm2
python reproduce.py --tasks vault --results "$OUT" --modes crl,exp-only,grpo,static --seeds 5 --iters ${ITERS:-300} -- \
    --actor smollm2 --extractor smollm2 $CLEAN --extractor-lr 3e-5 --final-attempts 3
