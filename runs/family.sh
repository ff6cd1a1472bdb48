#!/usr/bin/env bash
# Rebuilds results/family/: the paper's claim at 135M on a task both learners can learn, `--recipe family`
# (recipes.py says each value and why: six vault families each fixing its door, under the reveal; every mode's actor
# first taught to follow a lesson; 150 iterations; both held-out panels every 25, with and without lessons, and 144
# episodes each way at the end). Modes grpo, crl, the oracle (static with the scripted extractor: every lesson right,
# the ceiling) and static, seeds 1-5 (the pilots chose settings on seed 0), seed by seed. Finished cells are skipped
# and a cell resumes from its checkpoint (every 25 iterations), so the grid accumulates across sittings; a seed's
# lesson prior is trained once and cached (prior.py). One code version for the whole grid, all modes of a seed on one
# kind of machine (each folder's ran-on.txt; fp32 everywhere). Produced at 33b7efa, which every cell runs at: `git
# worktree add ../crl-grid 33b7efa` and this script run there (later commits change the table's code and the docs, not
# what a cell computes).
# Usage, from anywhere: bash runs/family.sh [ROOT] [JOBS]   writes ROOT/family/ (default ROOT: runs/rebuild; JOBS cells
# side by side, default 1: the 2-core CPU 1, an H200 5)
set -euo pipefail
cd "$(dirname "$0")/.."
python reproduce.py --tasks vault-family6-reveal --results "${1:-runs/rebuild}/family" --modes grpo,crl,oracle,static \
    --seeds "${SEEDS:-1-5}" --iters 150 --final-episodes 144 --jobs "${2:-1}" -- --recipe family
