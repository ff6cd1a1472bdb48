#!/usr/bin/env bash
# Rebuilds results/vault-head/: CRL against GRPO on the design the pilot chose (results/vault-reveal/pilot):
# the clean vault of results/vault-clean (no reveal: a lost episode may yield no lesson) with crl's extractor given a
# head start, the actor frozen for its first 150 of 300 iterations (pilot seeds 0 and 4: lessons right 0.97 / 0.56
# at iterations 90-120, 1.00 / 0.95 at 120-150, chosen on training metrics alone). Scored on the held-out vaults
# with balanced doors and names training never draws, 3 attempts each from an empty bank.
# The ceiling first: the oracle (static with the scripted extractor, every lesson right) and grpo, 5 seeds each
# (CEILING_ONLY=1 stops there); then crl (with --head-start 150; the table's `crl` row), static and exp-only, seed by
# seed: crl, grpo and static x 8 seeds, oracle and exp-only x 5. Finished cells are skipped and a cell with a
# checkpoint resumes, so the grid accumulates across runs of the script. Seed 0 of oracle, grpo and crl ran
# seeds-outermost (a49a373's order) before the ceiling was put first.
# Usage, from anywhere: bash runs/vault-head.sh [ROOT] [JOBS]   writes ROOT/vault-head/ (default ROOT: runs/rebuild;
# ROOT `results` resumes the committed record; JOBS cells side by side, default 1: the 2-core CPU 1, an H200 5
# (10 ran out of its 140 GB: a SmolLM2 cell holds 11-16 GB)).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-runs/rebuild}
JOBS=${2:-1}
OUT=$ROOT/vault-head
FLAGS="--actor smollm2 --extractor smollm2 --instance-visits 4 --groups 4 --bank-min-cosine 0.999
       --extractor-none failure --credit lift --merge-every 0 --extractor-lr 3e-5 --final-attempts 3"

grid() {   # MODES SEEDS [TRAIN FLAGS...]: those modes' seeds 0..SEEDS-1, through reproduce.py
    local modes=$1 seeds=$2; shift 2
    python reproduce.py --tasks vault --results "$OUT" --modes "$modes" --seeds "$seeds" --iters ${ITERS:-300} \
        --final-episodes ${FINAL:-256} --jobs "$JOBS" -- $FLAGS "$@"
}
# the ceiling first (if the oracle is not above GRPO at attempt 3 over 5 seeds, the rest is not worth running):
# oracle and grpo seed by seed (reproduce.py runs seeds outermost; JOBS > 1: JOBS cells at once), then the other modes
grid oracle,grpo 5
[ "$JOBS" -gt 1 ] && SEEDS=8 || SEEDS="1 2 3 4 5 6 7 8"
[ "${CEILING_ONLY:-0}" = 1 ] && exit 0
for k in $SEEDS; do
    grid grpo $k
    grid crl $k --head-start 150
    grid static $k
    grid exp-only $((k < 5 ? k : 5))
done
