#!/usr/bin/env bash
# vault-first's cells on a lent H200, side by side in one call, every mode of a seed on this one kind of machine:
#   bash runs/vault-first-h200.sh                                          seeds 5-7 of crl, grpo and static (the
#                                        modes those seeds have: exp-only and the oracle stop at 5), 9 cells, 384 s
#   SEEDS=4 MODES="oracle grpo crl static exp-only" bash runs/vault-first-h200.sh    seed 4's five cells, 282 s
# (2026-11-29, the machine warm between the two; 114 GB of the GPU's 140 at most, with 9.)
# The grid's code, not main's: its commit (e5675a1) is put in .gridcode here (ignored: echo /.gridcode/ >>
# .git/info/exclude) and carried,
#   mkdir .gridcode && git archive e5675a1 | tar -C .gridcode -x --exclude=results --exclude=data/alfworld-games.tar.xz
# with runs/vault-first.sh's flags (read from it), --distill inline (as the CPU distils; a GPU's default is the
# background) and --save-every 300 (one checkpoint, at the end: none comes back). The SmolLM2 packages travel as
# runs/gpu-carry.sh's parts (PARTS=4: a part and the tree fit 64 MiB; its header says how); this call carries the
# last part and .gridcode. Writes /tmp/g/vault-first and packs its cells (checkpoints left out) into $OUT/cells.tgz.
set -u
t0=$SECONDS
cd "$(dirname "$0")/.."
source runs/gpu-carry.sh there || exit 1   # the packages once, the environment, $OUT/env.txt and smi.txt
cd .gridcode
# the grid's flags, read from its own runs/vault-first.sh, so they cannot drift from the CPU cells'
GRID_FLAGS=$(sed -n '/^FLAGS="/,/"$/{s/^FLAGS="//;s/"$//;p}' runs/vault-first.sh)
[ -n "$GRID_FLAGS" ] || { echo "error: no FLAGS in .gridcode/runs/vault-first.sh" > "$OUT/log"; exit 1; }
export GRID_FLAGS
timeout $((${LIMIT:-560} - (SECONDS - t0))) python3 - > "$OUT/log" 2>&1 <<'EOF'
import os, time
from concurrent.futures import ThreadPoolExecutor
import reproduce
FLAGS = os.environ["GRID_FLAGS"].split()
t0 = time.time()

def cell(mode_seed):
    mode, seed = mode_seed
    extra = FLAGS + (["--head-start", "150"] if mode == "crl" else []) + ["--distill", "inline", "--save-every", "300"]
    a, extra = reproduce.parse_args(["--tasks", "vault", "--results", "/tmp/g/vault-first", "--modes", mode,
                                     "--seeds", "8", "--iters", "300", "--final-episodes", "256", "--jobs", "9",
                                     "--", *extra])
    try:
        reproduce.run_one("vault", mode, seed, a, extra)
        print(f"{mode} seed {seed}: done at {time.time() - t0:.0f} s", flush=True)
    except BaseException as e:   # one cell stopping leaves the others running
        print(f"{mode} seed {seed}: stopped at {time.time() - t0:.0f} s: {e}", flush=True)

with ThreadPoolExecutor(9) as pool:
    list(pool.map(cell, [(m, int(s)) for s in os.environ.get("SEEDS", "5 6 7").split()
                         for m in os.environ.get("MODES", "crl grpo static").split()]))
EOF
echo "rc $? at $((SECONDS - t0)) s" >> "$OUT/log"
pkill -TERM -f "train[.]py --tasks vault"; sleep 2   # cells a timeout cut short (the pattern never matches this shell)
date -u +end\ %FT%TZ >> "$OUT/env.txt"
cd /tmp/g && find vault-first -type f -size -15M -not -path '*ckpt*' | tar -czf "$OUT/cells.tgz" -T -
