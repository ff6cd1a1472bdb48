# One product at SmolLM2's shapes, 16 and 32 rows: torch's F.linear against oneDNN's laid-out weight (any commit)
import time, torch, torch.nn.functional as F
torch.manual_seed(0)
def r(fn, reps=50):
    fn(); t=time.perf_counter()
    for _ in range(reps): fn()
    return (time.perf_counter()-t)/reps*1e3
for (k,n) in [(576,960),(576,576),(576,3072),(1536,576),(576,49152)]:
    for dt in (torch.float32, torch.bfloat16):
        w=torch.randn(n,k).to(dt); x=torch.randn(16,k).to(dt)
        a=r(lambda: F.linear(x,w))
        p16=torch.ops.mkldnn._reorder_linear_weight(w,16); pn=torch.ops.mkldnn._reorder_linear_weight(w)
        b=r(lambda: torch.ops.mkldnn._linear_pointwise(x,p16,None,"none",[],""))
        c=r(lambda: torch.ops.mkldnn._linear_pointwise(x,pn,None,"none",[],""))
        x32=torch.randn(32,k).to(dt)
        d=r(lambda: torch.ops.mkldnn._linear_pointwise(x32,p16,None,"none",[],"")); e=r(lambda: F.linear(x32,w))
        same = torch.equal(F.linear(x,w), torch.ops.mkldnn._linear_pointwise(x,pn,None,"none",[],""))
        print(f"{str(dt)[6:]:8s} [16,{k}]x[{k},{n}] F.linear {a:.3f}  packed(16) {b:.3f}  packed(None) {c:.3f}  | batch 32: F.linear {e:.3f} packed(16) {d:.3f} | bit-equal {same}")
t=time.perf_counter(); w=torch.randn(49152,576); p=torch.ops.mkldnn._reorder_linear_weight(w); print("pack lm_head fp32 %.1f ms"%((time.perf_counter()-t)*1e3))
