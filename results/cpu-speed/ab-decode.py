"""Decode attention before and after, in one process, alternated: 6109044's reference (a gather of the cache rows, then
an fp32 copy) against this commit's dispatch (a view of consecutive rows; torch's fused attention in bf16). Generates
128 tokens x 16 rows after 256 prompt tokens, three times each. Usage, from the repository root:
python results/cpu-speed/ab-decode.py CKPT DTYPE   (CKPT: bench.py generate's checkpoint, e.g. /tmp/crl_bench_smollm2)
Prints the seconds of each and whether the sampled tokens match."""
import sys, time, torch, importlib, math
sys.path.insert(0, ".")   # run from the repository root
torch.set_num_threads(2)
from model import Transformer, generate
import model as M
da = importlib.import_module("kernels.decode_attention")
def old_ref(q, k_cache, v_cache, rows, lengths, scale=None):   # 6109044's reference
    B, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    n = int(lengths.max())
    k = k_cache[rows, :, :n].float()
    v = v_cache[rows, :, :n].float()
    qg = q.float().view(B, Hkv, Hq // Hkv, D)
    s = (qg @ k.transpose(-1, -2)) * scale
    valid = torch.arange(n, device=q.device)[None, :] < lengths[:, None]
    s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
    return (s.softmax(-1) @ v).reshape(B, Hq, D).to(q.dtype)
path, dt = sys.argv[1], getattr(torch, sys.argv[2])
m = Transformer.from_pretrained(path, dtype=dt)
V = m.config.vocab_size
g = torch.Generator().manual_seed(0)
prompts = torch.randint(0, V, (16, 256), generator=g).tolist()
generate(m, [p[:8] for p in prompts[:2]], 4, seed=0)
paths = {"old": old_ref, "new": da.decode_attention}
res = {k: [] for k in paths}
outs = {}
for rep in range(3):
    for k, fn in paths.items():
        M.decode_attention = fn
        t = time.perf_counter(); o = generate(m, prompts, 128, temperature=1.0, seed=0); res[k].append(time.perf_counter() - t)
        outs[k] = [s.tokens for s in o]
print(sys.argv[2], {k: [round(x, 2) for x in v] for k, v in res.items()}, "same tokens:", outs["old"] == outs["new"])
