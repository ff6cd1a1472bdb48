#!/usr/bin/env bash
# Rebuilds results/cpu-speed/: a SmolLM2 iteration split by phase in fp32 and in bf16 (the vault with the clean
# grid's flags, and room; 4 groups x 8), and decode against transformers' generate (batch 16), each on this CPU as
# it is and with torch held to AVX2 (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2: a CPU without AVX-512 or
# native bf16, as most laptops). Produced at the commit after 6109044 on a 2-core Xeon with AVX-512 BF16 and AMX,
# nothing else running (the committed step-table.txt's AVX-512 rows ran before the update's cast cache, its AVX2
# rows with it). The room in bf16 under AVX2 is left out: the vault's bf16 iteration took 348 s there. The committed
# generate.txt (one run each, before --reps) and step-before-after.txt also time 6109044's code, from a worktree of
# it with this bench.py copied in; ab.txt holds the alternated comparisons (results/cpu-speed/ab-*.py).
# Usage, from anywhere: bash runs/cpu-speed.sh [ROOT]   writes ROOT/cpu-speed/ (default ROOT: runs/rebuild)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/rebuild}/cpu-speed
mkdir -p "$OUT"
CLEAN="--instance-visits 4 --bank-min-cosine 0.999 --extractor-none failure --credit lift --merge-every 0 --extractor-lr 3e-5"
AVX2="ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2"
for kind in native avx2; do
    ENV=""; [ $kind = avx2 ] && ENV=$AVX2
    for task in vault room; do
        [ $kind = avx2 ] && [ $task = room ] && continue
        extra="--actor smollm2 --extractor smollm2"; [ $task = vault ] && extra="$extra $CLEAN"
        echo "== $kind $task"
        env $ENV python bench.py step --compare dtype --tasks $task --groups 4 --iters 3 --skip 1 --extra "$extra"
    done 2>&1 | grep -v "Warning\|warn(" >> "$OUT/step-table.txt"
    for shape in "qwen3-25m float32" "smollm2 float32" "smollm2 bfloat16"; do
        set -- $shape
        [ $kind = avx2 ] && [ $2 = bfloat16 ] && continue
        echo "== $kind $1 $2"
        env $ENV python bench.py generate --shape $1 --dtype $2 --turns 5
    done 2>&1 | grep -v "Warning\|warn(" >> "$OUT/generate.txt"
done
