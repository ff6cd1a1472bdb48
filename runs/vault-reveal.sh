#!/usr/bin/env bash
# Rebuilds results/vault-reveal/: the vault where every episode teaches (--vault-reveal: a lost episode ends by
# naming the door that would have opened), scored on held-out vaults with balanced doors and names training never
# draws, the attempts evaluation from an empty bank. First the ceiling: GRPO against the scripted oracle extractor
# (every lesson right; run as static), 5 seeds each; then a pilot of crl's levers, one seed, read on training
# metrics alone (CISPO steps, lessons right and the with - without gap by block of iterations).
# The flags of results/vault-clean, but that a loss must yield a lesson (--extractor-none never: under the reveal
# every transcript holds its vault's door).
# Usage, from anywhere: bash runs/vault-reveal.sh [ROOT] [JOBS] [PART]   writes ROOT/vault-reveal/ (default ROOT:
# runs/rebuild; JOBS grid cells side by side, default 1: a GPU takes 10, the 2-core CPU 1; PART: grid, pilot or
# both, the default). The committed grid ran on one H100, the pilot on the 2-core EPYC (each folder's ran-on.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-runs/rebuild}
JOBS=${2:-1}
PART=${3:-both}
OUT=$ROOT/vault-reveal
MODEL="--actor smollm2 --extractor smollm2"
REVEAL="--instance-visits 4 --groups 4 --bank-min-cosine 0.999 --credit lift --merge-every 0 --extractor-lr 3e-5
        --vault-reveal --extractor-none never"
PILOT="--tasks vault --mode crl --seed 1 --iters ${PILOT_ITERS:-150} --eval-every 0"

pilot() {   # ARM FLAGS...: one pilot arm, resumed from its checkpoint if it has one, skipped once finished
    local arm=$1; shift
    [ -f "$OUT/pilot/$arm/ckpt/state.pt" ] && set -- "$@" --resume
    # done once its curve is drawn, or once compacted into the record's form (reproduce.py --compact)
    [ -f "$OUT/pilot/$arm/curve.png" ] || [ -f "$OUT/pilot/$arm/metrics.jsonl.xz" ] ||
        python train.py $MODEL $REVEAL $PILOT --out "$OUT/pilot/$arm" "$@"
}
if [ "$PART" != pilot ]; then
    python reproduce.py --tasks vault --results "$OUT" --modes grpo,oracle --seeds 5 --iters ${ITERS:-300} \
        --final-episodes ${FINAL:-256} --jobs "$JOBS" -- $MODEL $REVEAL --final-attempts 3
fi
if [ "$PART" != grid ]; then
    pilot reveal
    pilot reveal-search1 --bank-search-batch 1
    pilot reveal-search1-lr1e-5 --bank-search-batch 1 --extractor-lr 1e-5   # reveal-search1's extractor collapsed
    # ... onto the first door of the actor's learned order (a wrong lesson naming it costs nothing): the extractor
    # alone, the actor frozen, shows when lessons turn right, which chooses the head start
    pilot reveal-search1-exp-only --bank-search-batch 1 --mode exp-only
    # it collapsed onto `east` (seed 1's exp-only cell in results/vault-clean did too): a second seed, with the actor
    # frozen for 90 iterations and then trained (a head start; 90 a guess, seed 1 gave no T)
    pilot reveal-search1-head90-seed0 --bank-search-batch 1 --head-start 90 --seed 0
    # under the reveal the frozen-actor extractor stayed at chance on both seeds; on the clean vault (no reveal, a
    # loss may yield no lesson) results/vault-clean's exp-only seed 0 learned by iteration 150: that design with the
    # actor frozen for those 150 iterations, then 60 of crl (does the co-evolution hold once the actor trains?)
    pilot clean-head150-seed0 --no-vault-reveal --extractor-none failure --head-start 150 --seed 0 --iters 210
    pilot clean-head150-seed4 --no-vault-reveal --extractor-none failure --head-start 150 --seed 4 --iters 180
fi
