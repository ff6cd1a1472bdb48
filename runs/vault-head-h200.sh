#!/usr/bin/env bash
# Rebuilds results/vault-head/h200/'s crl and static cells on a lent H200, five seeds side by side in one call each
# (2026-11-28: crl's five in 322 s, static's five in 289 s; each cell held at most 15 GB of the GPU's 140).
# On the GPU machine, after runs/gpu-carry.sh's parts p0 and p1 were kept (its header says how), carrying .gpu/p2:
#   bash runs/vault-head-h200.sh crl      the parts put together, SmolLM2 converted, then crl seeds 0-4
#   bash runs/vault-head-h200.sh static   (the machine still warm) static seeds 0-4
# vault-head's flags, with --distill inline (as the CPU distils, so crl's bank is read as in the CPU comparison; a
# GPU's default is distillation in the background) and --save-every 300 (one checkpoint at the end: none comes back).
# Writes /tmp/g/vault-head and packs its cells (checkpoints left out) into $OUT/cells.tgz.
set -u
MODE=${1:?usage: bash runs/vault-head-h200.sh crl|static}
t0=$SECONDS
cd "$(dirname "$0")/.."
source runs/gpu-carry.sh there || exit 1   # the packages once, the environment, $OUT/env.txt and smi.txt
FLAGS="--actor smollm2 --extractor smollm2 --instance-visits 4 --groups 4 --bank-min-cosine 0.999
       --extractor-none failure --credit lift --merge-every 0 --extractor-lr 3e-5 --final-attempts 3"
HEAD=$([ "$MODE" = crl ] && echo "--head-start 150")
timeout $((${LIMIT:-570} - (SECONDS - t0))) python3 reproduce.py --tasks vault --results /tmp/g/vault-head \
    --modes "$MODE" --seeds 5 --iters 300 --final-episodes 256 --jobs 5 -- $FLAGS $HEAD --distill inline \
    --save-every 300 > "$OUT/log" 2>&1
echo "rc $? at $((SECONDS - t0)) s" >> "$OUT/log"
pkill -TERM -f "train[.]py --tasks vault"; sleep 2   # cells a timeout cut short (the pattern never matches this shell)
date -u +end\ %FT%TZ >> "$OUT/env.txt"
cd /tmp/g && find vault-head -type f -size -15M -not -path '*ckpt*' | tar -czf "$OUT/cells.tgz" -T -
