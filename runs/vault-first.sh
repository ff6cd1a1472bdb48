#!/usr/bin/env bash
# Rebuilds results/vault-first/: CRL against GRPO on the design results/vault-prior's pilot chose, on training
# metrics alone: the vault where a lost episode names its door (--vault-reveal; every episode yields a lesson,
# --extractor-none never), every mode's actor first taught to follow a lesson and then search (--lesson-prior 25),
# and the extractor's credit paid only for a first-action win (--credit-discount 0: a wrong lesson costs the same
# whichever door it names). crl's extractor has a head start: the actor frozen for its first 150 of 300 iterations
# (vault-prior's reveal-first/: on seeds 2 and 4, whose plain reveal stayed at chance, lessons right 0.95 and 0.97 at
# iterations 120-149; seed 3 stayed on one door, and with an entropy term on top too: reveal-first-entropy/).
# Scored as results/vault-head is: 256 held-out vaults with balanced doors and names training never draws, 3 attempts
# each from an empty bank. The ceiling first (the oracle: static with the scripted extractor, every lesson right;
# and grpo, 5 seeds each; CEILING_ONLY=1 stops there), then crl, grpo and static seed by seed to 8 seeds, exp-only to
# 5. Finished cells are skipped and a cell with a checkpoint (every 30 iterations) resumes, so the grid accumulates
# across sittings; one code version on one kind of machine for the whole comparison (each folder's ran-on.txt).
# Usage, from anywhere: bash runs/vault-first.sh [ROOT] [JOBS]   writes ROOT/vault-first/ (default ROOT: runs/rebuild;
# ROOT `results` resumes the committed record; JOBS cells side by side, default 1: the 2-core CPU 1, an H200 5).
# Produced at e5675a1 (the method of ade97fb); its cells replay value for value at 8280bad or earlier, not from fc3ad86
# on, where the lesson prior rounds differently (runs/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-runs/rebuild}
JOBS=${2:-1}
OUT=$ROOT/vault-first
FLAGS="--actor smollm2 --extractor smollm2 --instance-visits 4 --groups 4 --bank-min-cosine 0.999
       --extractor-none never --credit lift --merge-every 0 --extractor-lr 3e-5 --final-attempts 3
       --vault-reveal --lesson-prior 25 --credit-discount 0 --save-every 30"

grid() {   # MODES SEEDS [TRAIN FLAGS...]: those modes' seeds 0..SEEDS-1, through reproduce.py
    local modes=$1 seeds=$2; shift 2
    python reproduce.py --tasks vault --results "$OUT" --modes "$modes" --seeds "$seeds" --iters ${ITERS:-300} \
        --final-episodes ${FINAL:-256} --jobs "$JOBS" -- $FLAGS "$@"
}
grid oracle,grpo 5
[ "$JOBS" -gt 1 ] && SEEDS=8 || SEEDS="1 2 3 4 5 6 7 8"
[ "${CEILING_ONLY:-0}" = 1 ] && exit 0
for k in $SEEDS; do
    grid crl $k --head-start 150
    grid grpo $k
    grid static $k
    grid exp-only $((k < 5 ? k : 5))
done
