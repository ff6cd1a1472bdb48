"""Run under torchrun (2 ranks, gloo) by test_parallel.py; rank 0 saves what the tests compare.

`units OUT`: FSDP pieces on fixed episodes: the update (grpo, cispo), uneven micro-batch counts after
rank-divergent generation on the gathered copy, the HF export (untied, tied), a DCP save/load, and bf16
compute on fp32 masters. `train OUT`: train.py end to end: --fsdp for 2 iterations, 1 iteration then
--resume, and background distillation under DDP, run twice.
"""
import json
import os
import sys
import threading
from datetime import timedelta
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import crl  # noqa: E402
import parallel  # noqa: E402
import train  # noqa: E402
from model import generate  # noqa: E402
from test_train import FAST, bound_loss, fixed_segments  # noqa: E402
from small.tiny import tiny_model  # noqa: E402

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
CPU = torch.device("cpu")
PROMPTS = [[1, 5, 9, 14, 3], [2, 7], [4, 4, 8, 1, 1, 6, 2]]


def sharded(seed=0, dtype=torch.float32, checkpointing=False, **overrides):
    full = tiny_model(seed=seed, **overrides) if rank == 0 else None
    return parallel.prepare(full, CPU, dtype, fsdp=True, checkpointing=checkpointing)


def gathered(model) -> dict:
    """The full fp32 weights (a collective)."""
    return parallel.plain_copy(model, torch.float32).state_dict()


def update(model, opt, which, objective="grpo", micro_batch=2):
    segs, advs = fixed_segments(tiny_model(seed=0))   # the same episodes on every rank
    return crl.policy_update(crl.Update(model, opt, *bound_loss(objective), micro_batch=micro_batch),
                             [segs[i] for i in which], [advs[i] for i in which])


def units(out):
    res = {}
    for objective in ("grpo", "cispo"):          # 3 + 3 segments, 2 micro-batches each
        model = sharded()
        update(model, torch.optim.SGD(model.parameters(), lr=1.0), range(rank, 6, world), objective)
        res[objective] = gathered(model)

    # generation on the gathered copy; rank 0 generates once more (a rollout's calls differ by rank); then an
    # update with 4 micro-batches on rank 0 and 2 on rank 1, blocks checkpointed
    model = sharded(checkpointing=True)
    copy = parallel.rollout_copy(model)
    samples = generate(copy, PROMPTS, 8, generator=torch.Generator().manual_seed(0))
    if rank == 0:
        generate(copy, PROMPTS[:1], 5, generator=torch.Generator().manual_seed(1))
    del copy
    update(model, torch.optim.SGD(model.parameters(), lr=1.0), [0, 1, 2, 3] if rank == 0 else [4, 5],
           micro_batch=1)
    res["uneven"], res["samples"] = gathered(model), [(s.tokens, s.logprobs) for s in samples]
    parallel.save_pretrained(model, os.path.join(out, "hf_untied"))
    parallel.save_pretrained(sharded(seed=1, tie_word_embeddings=True), os.path.join(out, "hf_tied"))

    # DCP: one AdamW step, save; a differently initialised model loads it; one more step on both
    mine = range(rank, 6, world)
    runs = []
    for seed in (0, 5):
        model = sharded(seed)
        runs.append(SimpleNamespace(actor=model, actor_opt=torch.optim.AdamW(model.parameters(), lr=1e-3),
                                    extractor=None, extractor_opt=None))
    update(runs[0].actor, runs[0].actor_opt, mine)
    parallel.save_sharded(runs[0], os.path.join(out, "dcp"))
    parallel.load_sharded(runs[1], os.path.join(out, "dcp"))
    for r in runs:
        update(r.actor, r.actor_opt, mine, "cispo")
    res["dcp"] = [gathered(r.actor) for r in runs]

    # bf16 compute (MixedPrecisionPolicy) on fp32 masters: one AdamW step at the authors' lr
    model = sharded(dtype=torch.bfloat16)
    update(model, torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0), mine)
    res["mp_master_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    res["mp"] = gathered(model)
    if rank == 0:
        torch.save(res, os.path.join(out, "units.pt"))


def train_runs(out):
    def tiny(name, *flags, iters=2):
        return train.main(["--tasks", "room", "--iters", str(iters), "--out", os.path.join(out, name), *FAST,
                           *flags])

    def bank_of(run):
        bank = run.manager.bank
        return [(e.id, e.task, e.text, e.source, e.uses, e.successes) for t in bank.tasks() for e in bank.entries(t)]

    res = {}
    tiny("full", "--fsdp", "--checkpoint-blocks")
    run = tiny("part", "--fsdp", "--checkpoint-blocks", iters=1)
    res["saved_generations"] = sorted(run.generations)
    build = train.build

    def spy(*args):   # what the resumed run starts from
        run, start = build(*args)
        res["resumed_generations"] = sorted(run.generations)
        return run, start
    train.build = spy
    tiny("part", "--fsdp", "--checkpoint-blocks", "--resume")
    train.build = build

    distill, threads = crl.distill, set()

    def where(*args):
        threads.add(threading.current_thread().name)
        return distill(*args)
    crl.distill = where
    res["async"] = [bank_of(tiny(name, "--distill", "background")) for name in ("async", "async2")]
    crl.distill = distill
    res["distill_threads"] = sorted(threads)
    with open(os.path.join(out, f"train{rank}.json"), "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    if sys.argv[1] == "units":
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))   # a regression fails fast, not hangs
        units(sys.argv[2])
        dist.barrier()
        dist.destroy_process_group()
    else:   # one process group for the several train.main calls (each uses it and leaves it open)
        dist.init_process_group("gloo", timeout=timedelta(seconds=120))
        train_runs(sys.argv[2])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)   # skip gloo's thread teardown (see ddp_worker.py)
