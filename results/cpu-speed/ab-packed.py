# Run at 120ec13 (its layers are nn.Linear, whose forward this swaps): python results/cpu-speed/ab-packed.py
import sys, statistics, time, torch, torch.nn as nn, torch.nn.functional as F
sys.path.insert(0, ".")
import bench
from model import Transformer, generate
from sampling import Sampling
torch.manual_seed(0)
# prefill-size rates
for (k,n) in [(576,960),(576,3072),(576,49152)]:
    for M in (16, 4096):
        w=torch.randn(n,k); x=torch.randn(M,k); wm=torch.ops.mkldnn._reorder_linear_weight(w, M if M<=64 else None) if True else None
        wm16=torch.ops.mkldnn._reorder_linear_weight(w, 16)
        def r(fn, reps=10 if M>16 else 50):
            fn(); t=time.perf_counter()
            for _ in range(reps): fn()
            return (time.perf_counter()-t)/reps*1e3
        a=r(lambda: F.linear(x,w)); b=r(lambda: torch.ops.mkldnn._linear_pointwise(x,wm16,None,"none",[],""))
        wd=w.to_mkldnn()
        c=r(lambda: torch._C._nn.mkldnn_linear(x.to_mkldnn(), wd, None).to_dense())
        print(f"[{M},{k}]x[{k},{n}]: F.linear {a:.3f} ms, packed(16) {b:.3f} ms, to_mkldnn util {c:.3f} ms")
cache = {}
orig = nn.Linear.forward
def fwd(self, x):
    w = self.weight
    if torch.is_grad_enabled() or w.dtype != torch.float32 or not x.is_cpu: return orig(self, x)
    key = (w.data_ptr(), w._version)
    if cache.get(id(self), (None,))[0] != key:
        cache[id(self)] = (key, torch.ops.mkldnn._reorder_linear_weight(w, 16))
    return torch.ops.mkldnn._linear_pointwise(x, cache[id(self)][1], self.bias, "none", [], "")
path = bench._checkpoint(None, "smollm2")
ours = Transformer.from_pretrained(path, dtype=torch.float32)
p = torch.randint(0, ours.config.vocab_size, (16, 256), generator=torch.Generator().manual_seed(0))
def o(n): return bench._timed(lambda: generate(ours, p.tolist(), n, Sampling(1.0), seed=0))
o(2)
base=[]; new=[]
for _ in range(3):
    nn.Linear.forward = orig; base.append(((o(65)[1] - o(1)[1]) / 64 * 1e3, o(1)[1]*1e3))
    nn.Linear.forward = fwd; new.append(((o(65)[1] - o(1)[1]) / 64 * 1e3, o(1)[1]*1e3))
print("F.linear decode step ms, prefill+1 ms:", base)
print("packed   decode step ms, prefill+1 ms:", new)
nn.Linear.forward = orig; a = o(32)[0]; nn.Linear.forward = fwd; b = o(32)[0]
same = sum(x.tokens == y.tokens for x, y in zip(a, b)); print("rows with identical 32 sampled tokens:", same, "of 16")
