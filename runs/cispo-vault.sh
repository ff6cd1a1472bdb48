#!/usr/bin/env bash
# Rebuilds results/cispo-vault/: can CISPO teach the SmolLM2 extractor to name the door that opened, apart from
# the actor (probes/vault/cispo_vault.py)? 16 fresh vaults a step, each arm 200 steps (the second set 150):
#   oracle-*: every episode won, and the follower wins exactly when the lesson names the vault's door;
#   real-*: 3 episodes in 8 won, the follower wins 0.61 with the right door and 0.15 with a wrong one (the
#   untrained SmolLM2 actor's oracle and shuffled controls);
#   then what breaks the real arm: real-won-* (the follower's noise alone, every episode won), oracle-mixed-*
#   (the losses alone, a noiseless follower), real-none-* (the real arm, NONE allowed).
# Usage, from anywhere: bash runs/cispo-vault.sh [ROOT]   writes ROOT/cispo-vault/ARM (default ROOT runs/rebuild).
# ONLY="ARM ..." runs only those arms. On a GPU (PARALLEL=1) the arms run side by side; on a CPU one after
# another, about 11 s a step (results/cispo-vault ran on one H200, with FLAGS="--embedder smollm2": the bank's
# keys play no part here, and the packaged MiniLM did not travel to it).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/rebuild}/cispo-vault
source runs/probe-arms.sh
REAL="--p-won 0.375 --p-right 0.61 --p-wrong 0.15"
mkdir -p "$OUT"
for lr in 1e-5 1e-4 1e-3; do run oracle-lr$lr --steps 200 --extractor-lr $lr; done
for lr in 1e-5 1e-4; do
    run real-lr$lr --steps 200 --extractor-lr $lr $REAL
    run real-won-lr$lr --steps 150 --extractor-lr $lr $REAL --p-won 1
    run oracle-mixed-lr$lr --steps 150 --extractor-lr $lr --p-won 0.375
done
run real-none-lr1e-5 --steps 150 --extractor-lr 1e-5 $REAL --extractor-none always
wait
