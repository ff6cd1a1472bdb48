#!/usr/bin/env bash
# Its options (--lesson-sets, --query-map, --recent-moves) were retired after beda864: run this script in a checkout
# of beda864 or of the commit named below (git worktree add ../crl-beda864 beda864).
# Rebuilds results/cispo-sets/: can CISPO teach the SmolLM2 extractor to write, after a lost vault, the doors the
# play left untried (--lesson-sets), the one lesson that lifts a trained actor on the vaults it lost
# (results/vault-clean/controls: 0.02 -> 0.29)? The probe of runs/cispo-vault.sh (probes/vault/cispo_vault.py: 16
# fresh scripted vaults a step, nothing else of a run) with the clean vault's extractor flags, each arm 120 steps:
#   crl-*:  3 vaults in 8 won, played as the trained crl actor plays them: it wins again a vault it won whatever
#           the lesson says (0.99 right, 0.94 wrong; without a lesson 0.99), and on a vault it lost it opens with
#           its old first door, then takes the lesson's doors (probes.vault.cispo_vault.habit_wins), following a lesson
#           0.73 of the time (its 0.29 with the doors left); credited by lift against the vault played without;
#   lost-*: every vault lost (the lessons after a loss alone);
#   door-lr3e-5: crl-lr3e-5 with the grid's one-door lessons, for contrast (after a loss, at most one door).
# Every arm writes a lesson after every episode (--extractor-none never): given NONE after a loss, the untrained
# extractor takes it 0.975 of the time under the set grammar, and a NONE is never credited, so nothing is learned.
# Usage, from anywhere: bash runs/cispo-sets.sh [ROOT]   writes ROOT/cispo-sets/ARM (default ROOT runs/rebuild).
# ONLY="ARM ..." runs only those arms. On a GPU (PARALLEL=1) the arms run side by side; on a CPU one after
# another (results/cispo-sets ran on one H200, on the code of the commit that added this script, with FLAGS="--embedder
# smollm2" (the bank's keys play no part here), stopped after 375 s: the crl arms at step 40, lost at 80, door at 120;
# the exact policy over the 511 set lessons made their evaluations the slow part).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/rebuild}/cispo-sets
source runs/probe-arms.sh
CLEAN="--extractor-none never --credit lift --p-follow 0.73 --p-again 0.99 --steps ${STEPS:-120}"
CRL="--p-won 0.375 --p-right 0.99 --p-wrong 0.94"
mkdir -p "$OUT"
for lr in 3e-5 1e-4; do
    run crl-lr$lr --lesson-sets $CLEAN $CRL --extractor-lr $lr
    run lost-lr$lr --lesson-sets $CLEAN --p-won 0 --extractor-lr $lr
done
run door-lr3e-5 $CLEAN $CRL --extractor-lr 3e-5
wait
