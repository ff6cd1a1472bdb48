"""The update's cast cache, in one process, alternated: one autocast context a micro-batch (6109044) against one a
step (this commit); bf16 compute on fp32 masters, SmolLM2's shape, 16 random segments of ~330 tokens with 9 trained
tokens each, micro-batches of 8. Asserts identical gradients, prints the seconds of each. Usage, from the repository
root: python results/cpu-speed/ab-update.py CKPT [N]   (CKPT: e.g. /tmp/crl_bench_smollm2, bench.py generate's)"""
import sys, time, random, functools, types, torch
sys.path.insert(0, ".")   # run from the repository root
torch.set_num_threads(2)
import crl, parallel
from model import Transformer, Sampling, token_logprobs
from parallel import autocast, pad_segments, micro_batches, Update

def old_backward(run, update, segments, advantages, denoms):   # the code before: an autocast a micro-batch
    cfg, model = run.cfg, update.model
    for idx in micro_batches([len(s.tokens) for s in segments], cfg.micro_batch, cfg.micro_tokens):
        batch = [segments[j] for j in idx]
        tokens, mask, old = pad_segments(batch, "cpu")
        adv = torch.tensor([advantages[j] for j in idx])
        seq_tokens = torch.tensor([float(max(sum(s.mask), 1)) for s in batch])
        with autocast(model):
            logp = token_logprobs(model, tokens, mask, allowed=[s.allowed for s in batch])
        update.loss(logp, old, adv, mask, **denoms, seq_tokens=seq_tokens).backward()

path = sys.argv[1]
m = Transformer.from_pretrained(path, dtype=torch.float32)
m.compute_dtype = torch.bfloat16
rng = random.Random(0)
segs = []
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 16):
    s = crl.Segment(); n = rng.randint(250, 350)
    s.extend([rng.randrange(1000) for _ in range(n)])
    for _ in range(3):
        s.extend([rng.randrange(1000) for _ in range(3)], mask=True, logprobs=[-1.0] * 3)
        s.extend([rng.randrange(1000) for _ in range(20)])
    segs.append(s)
adv = [rng.choice([-1.0, 1.0]) for _ in segs]
run = types.SimpleNamespace(cfg=types.SimpleNamespace(micro_batch=8, micro_tokens=8192))
update = Update(m, None, functools.partial(crl.grpo_loss, clip=0.2), (0.8, 1.2), Sampling())
denoms = dict(num_seqs=float(len(segs)))
def grads(fn):
    m.zero_grad(set_to_none=True)
    t = time.perf_counter(); fn(run, update, segs, adv, denoms); dt = time.perf_counter() - t
    return [p.grad.clone() for p in m.parameters()], dt
times = {"old": [], "new": []}
for rep in range(3):
    g_old, t = grads(old_backward); times["old"].append(t)
    g_new, t = grads(parallel.backward_micro_batches); times["new"].append(t)
    assert all(torch.equal(a, b) for a, b in zip(g_old, g_new)), "gradients differ"
print("identical gradients;", {k: [round(x, 2) for x in v] for k, v in times.items()})
