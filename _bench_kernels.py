"""bench kernels: each Triton kernel beside its torch reference on the same inputs (CUDA only; on CPU the
Triton path exists only in the interpreter, which is a test tool, not something to time). To be merged
into bench.py as `python bench.py kernels`."""
import sys
import time

import torch


def _time_ms(fn, iters=50):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e3


def _peak_mib(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _row(name, ours, ref, unit="ms"):
    print(f"{name:<44} triton {ours:9.3f} {unit}   torch {ref:9.3f} {unit}   ratio (torch/triton) {ref / ours:6.2f}x")


def main(argv=None):
    from kernels.decode_attention import decode_attention_ref, decode_attention_triton
    from kernels.logsoftmax import selective_log_softmax_ref, selective_log_softmax_triton
    from kernels.rmsnorm import rmsnorm_ref, rmsnorm_triton
    from kernels.rope import apply_rope_ref, apply_rope_triton
    if not torch.cuda.is_available():
        print("bench kernels: skipped, the Triton kernels need a CUDA device (CPU runs use the torch references)")
        return 0
    dev, bf = "cuda", torch.bfloat16
    torch.manual_seed(0)
    x, w = torch.randn(16 * 512, 1024, device=dev, dtype=bf), torch.randn(1024, device=dev, dtype=bf)
    _row("rmsnorm 8192 x 1024 bf16", _time_ms(lambda: rmsnorm_triton(x, w, 1e-6)),
         _time_ms(lambda: rmsnorm_ref(x, w, 1e-6)))
    x = torch.randn(16, 512, 3 * 16, 64, device=dev, dtype=bf)[:, :, :16]
    c, s = torch.randn(16, 512, 32, device=dev), torch.randn(16, 512, 32, device=dev)
    _row("rope [16, 512, 16, 64] bf16 view", _time_ms(lambda: apply_rope_triton(x, c, s)),
         _time_ms(lambda: apply_rope_ref(x, c, s)))
    kc = torch.randn(32, 8, 2048, 64, device=dev, dtype=bf)
    vc = torch.randn_like(kc)
    q = torch.randn(16, 16, 64, device=dev, dtype=bf)
    rows = torch.randperm(32, device=dev)[:16]
    lengths = torch.randint(1, 2049, (16,), device=dev)
    _row("decode attn B16 Hq16 Hkv8 L<=2048 D64 bf16", _time_ms(lambda: decode_attention_triton(q, kc, vc, rows, lengths)),
         _time_ms(lambda: decode_attention_ref(q, kc, vc, rows, lengths)))
    logits = torch.randn(4096, 151936, device=dev, dtype=bf, requires_grad=True)
    t = torch.randint(0, 151936, (4096,), device=dev)

    def fwd_bwd(fn):
        return lambda: fn(logits, t).sum().backward()
    _row("selective log-softmax 4096 x 151936 fwd+bwd", _time_ms(fwd_bwd(selective_log_softmax_triton), 10),
         _time_ms(fwd_bwd(selective_log_softmax_ref), 10))
    logits.grad = None
    ours = _peak_mib(fwd_bwd(selective_log_softmax_triton))
    logits.grad = None
    ref = _peak_mib(fwd_bwd(selective_log_softmax_ref))
    _row("  peak extra memory", ours, ref, unit="MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
