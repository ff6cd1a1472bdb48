#!/usr/bin/env bash
# Rebuilds results/vault-first/: CRL against GRPO on the design results/vault-prior's pilot chose, on training
# metrics alone: `--recipe vault-first` (recipes.py says each value and why: the vault where a lost episode names its
# door, every mode's actor first taught to follow a lesson, the extractor's credit paid only for a first-action
# win, crl's actor frozen for its first 150 of 300 iterations). Scored as results/vault-head is: 256 held-out vaults
# with balanced doors and names training never draws, 3 attempts each from an empty bank. The ceiling first (the
# oracle: static with the scripted extractor, every lesson right; and grpo, 5 seeds each; CEILING_ONLY=1 stops
# there), then crl, grpo and static seed by seed to 8 seeds, exp-only to 5. Finished cells are skipped and a cell
# with a checkpoint (every 30 iterations) resumes, so the grid accumulates across sittings; one code version on one
# kind of machine for the whole comparison (each folder's ran-on.txt).
# Usage, from anywhere: bash runs/vault-first.sh [ROOT] [JOBS]   writes ROOT/vault-first/ (default ROOT: runs/rebuild;
# JOBS cells side by side, default 1: the 2-core CPU 1, an H200 5). The committed cells sit under vault/, the task's
# name when they ran; a rebuild writes vault-reveal/.
# Produced at e5675a1 (the method of ade97fb) with the recipe's values as 13 flags (--vault-reveal, --credit lift
# --credit-discount 0, ...); its cells replay value for value at 8280bad or earlier, not from fc3ad86 on, where the
# lesson prior rounds differently (runs/README.md). From the commit that made it a recipe, train.py reads those cells'
# flags as the recipe's (rundir.migrate).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-runs/rebuild}
JOBS=${2:-1}
OUT=$ROOT/vault-first
grid() {   # MODES SEEDS [TRAIN FLAGS...]: those modes' seeds 0..SEEDS-1, through reproduce.py
    local modes=$1 seeds=$2; shift 2
    python reproduce.py --tasks vault-reveal --results "$OUT" --modes "$modes" --seeds "$seeds" --iters ${ITERS:-300} \
        --final-episodes ${FINAL:-256} --jobs "$JOBS" -- --recipe vault-first "$@"
}
grid oracle,grpo 5
[ "$JOBS" -gt 1 ] && SEEDS=8 || SEEDS="1 2 3 4 5 6 7 8"
[ "${CEILING_ONLY:-0}" = 1 ] && exit 0
for k in $SEEDS; do
    grid crl $k
    grid grpo $k
    grid static $k
    grid exp-only $((k < 5 ? k : 5))
done
