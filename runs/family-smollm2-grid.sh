#!/usr/bin/env bash
# The paper's claim at 135M (not yet run): on vault-family6 (F = 6, chosen on GRPO's training curve in
# results/family-smollm2/pilot/), grpo, the oracle (static with the scripted extractor), static (SmolLM2's extractor,
# frozen) and crl (that extractor trained by CISPO) x seeds 0-4, 300 iterations of 4 groups x 8, SmolLM2-135M-Instruct
# as actor and extractor, every mode's actor first taught to follow a lesson (--lesson-prior 25, the same init per seed
# in every mode); held-out panels (transfer: new vaults of the six seen families; control: families never drawn) every
# 50 iterations with and without lessons, 64 each way, and 256 each way at the end. Cells resume; each is compacted as
# it finishes. Cost: on the Xeon (AMX) a GRPO iteration ~1.8 s, on an AVX2-only CPU ~9 s; a crl iteration more (the
# extractor's generate and CISPO). With a GPU, JOBS=5 runs five cells side by side; all modes of a seed on one kind.
# Usage, from anywhere: bash runs/family-smollm2-grid.sh [ROOT]   writes ROOT/family-smollm2/ (default: runs/rebuild)
set -euo pipefail
cd "$(dirname "$0")/.."
python reproduce.py --tasks vault-family6 --results "${1:-runs/rebuild}/family-smollm2" --modes grpo,oracle,static,crl \
    --seeds ${SEEDS:-5} --iters 300 --final-episodes 256 --jobs ${JOBS:-1} -- --actor smollm2 --extractor smollm2 \
    --groups 4 --lesson-prior 25 --eval-every 50
