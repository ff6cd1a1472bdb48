"""ops/: every Triton kernel against its plain torch reference, run on CPU through Triton's interpreter.

On a machine without CUDA, conftest.py sets TRITON_INTERPRET=1 before ops/ is imported; triton reads it
when @triton.jit decorates a kernel, so the kernels become interpreted functions that run on CPU tensors
(checked first below). With CUDA the kernels compile instead; tests/test_gpu.py checks them on the GPU.
Shapes are small and odd on purpose: non-power-of-two widths, head_dim 24, ragged cache lengths, several
blocks per row so the online loops really loop. Triton is a requirement on Linux (a test fails if it does not
import there) and has no wheels elsewhere, where the Triton tests skip; one test runs model.py in a process
where importing triton fails."""
import importlib
import json
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from ops._triton import InterpretedFunction, triton

# import_module, not `from ops import rmsnorm`: the package re-exports the dispatch functions under the
# same names as their modules (ops.rmsnorm is the function rmsnorm there).
da = importlib.import_module("ops.decode_attention")
ls = importlib.import_module("ops.logsoftmax")
rn = importlib.import_module("ops.rmsnorm")
rp = importlib.import_module("ops.rope")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTYPES = [torch.float32, torch.bfloat16]
needs_triton = pytest.mark.skipif(triton is None and sys.platform != "linux",
                                  reason="Triton ships Linux wheels only")
INTERPRETED = triton is not None and isinstance(rn._rmsnorm_kernel, InterpretedFunction)
interpreted = pytest.mark.skipif(not INTERPRETED, reason="needs Triton's interpreter: Triton is not installed, or "
                                 "this machine has CUDA and the kernels compiled (tests/test_gpu.py checks them)")


def close(actual, expected, dtype):
    """fp32: 1e-5; bf16: one bf16 rounding step apart at most (the fp32 math differs only in summation order)."""
    if dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(actual, expected, rtol=1.6e-2, atol=1e-2)


@pytest.mark.skipif(sys.platform != "linux", reason="Triton ships Linux wheels only")
def test_triton_imports_on_linux():
    """ops/_triton.py turns a failed import into the torch fallbacks; on Linux, where requirements.txt
    installs Triton, that would quietly skip every kernel test, so import it here and let the error show."""
    import triton as direct   # noqa: F401
    assert triton is not None



def test_no_module_of_ours_shadows_an_installed_package():
    """Run from the repository's root, our top-level modules come first on sys.path, so one named like an installed
    distribution's package hides it from everything that imports it: transformers 5.25 requires the `kernels`
    package and imports it from its activation functions, which failed while this package was kernels/."""
    import importlib.metadata
    installed = importlib.metadata.packages_distributions()
    ours = {n.removesuffix(".py") for n in os.listdir(ROOT) if n.endswith(".py")
            or os.path.isfile(os.path.join(ROOT, n, "__init__.py"))}
    assert not {n: installed[n] for n in ours if n in installed}
@pytest.mark.skipif(triton is None or torch.cuda.is_available(), reason="CPU-only machines with Triton")
def test_interpreter_is_active():
    for kernel in (rn._rmsnorm_kernel, rp._rope_kernel, da._decode_attention_kernel,
                   ls._logsoftmax_fwd_kernel, ls._logsoftmax_bwd_kernel):
        assert isinstance(kernel, InterpretedFunction), "TRITON_INTERPRET=1 was not set before ops/ was imported"


@needs_triton
def test_cpu_without_interpreter_is_a_clear_error():
    code = ("import os; os.environ.pop('TRITON_INTERPRET', None); import torch\n"
            "from ops.rmsnorm import rmsnorm_triton\n"
            "try:\n    rmsnorm_triton(torch.ones(2, 3), torch.ones(3), 1e-6)\n"
            "except ValueError as e:\n    print('ValueError:', e)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert "ValueError:" in res.stdout and "TRITON_INTERPRET=1" in res.stdout, res.stdout + res.stderr


# ---------------------------------------------------------------- rmsnorm
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", [None, 16])  # one chunk per row / five chunks per row
@interpreted
def test_rmsnorm_matches_reference(dtype, block):
    g = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(3, 77, generator=g)).to(dtype)
    w = torch.randn(77, generator=g)
    y = rn.rmsnorm_triton(x, w, 1e-6, block=block)
    assert y.dtype == dtype and y.shape == x.shape
    close(y, rn.rmsnorm_ref(x, w, 1e-6), dtype)


@interpreted
def test_rmsnorm_strided_batched_input():
    """q/k norm in Qwen3 normalises each head of a [B, T, H, D] view; a transposed view must work too."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 5, 24, generator=g).transpose(1, 2)  # [2, 5, 3, 24], not contiguous
    w = torch.randn(24, generator=g)
    close(rn.rmsnorm_triton(x, w, 1e-5), rn.rmsnorm_ref(x, w, 1e-5), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 77), (2, 7, 5, 24)])
@interpreted
def test_rmsnorm_backward_matches_reference(dtype, shape, monkeypatch):
    """dx and dw of `_RMSNorm` against autograd through the reference: odd widths, per-head rows (Qwen3's q/k
    norm), and two programs so each one sums several rows' share of dw."""
    monkeypatch.setattr(rn, "BACKWARD_PROGRAMS", 2)
    g = torch.Generator().manual_seed(11)
    x = (3 * torch.randn(*shape, generator=g)).to(dtype).requires_grad_()
    w = torch.randn(shape[-1], generator=g).requires_grad_()
    dy = torch.randn(*shape, generator=g).to(dtype)
    grads = [torch.autograd.grad(norm(x, w, 1e-6), (x, w), dy) for norm in (rn._RMSNorm.apply, rn.rmsnorm_ref)]
    close(grads[0][0], grads[1][0], dtype)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-4 if dtype == torch.float32 else 2e-2, atol=1e-4)


def test_rmsnorm_reference_is_torch_rmsnorm():
    """The spec itself against an independent implementation (torch.nn.functional.rms_norm)."""
    x, w = torch.randn(3, 77), torch.randn(77)
    torch.testing.assert_close(rn.rmsnorm_ref(x, w, 1e-6), F.rms_norm(x, (77,), w, 1e-6), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- rope
@pytest.mark.parametrize("dtype", DTYPES)
@interpreted
def test_rope_matches_reference_on_strided_views(dtype):
    g = torch.Generator().manual_seed(2)
    B, T, H, D = 2, 5, 3, 24
    qkv = torch.randn(B, T, 3 * H + 1, D, generator=g).to(dtype)
    x = qkv[:, :, 1:1 + H]  # a slice of a fused projection: non-contiguous
    assert not x.is_contiguous()
    pos = torch.arange(T, dtype=torch.float32)[None, :] + torch.tensor([[0.0], [7.0]])  # ragged row offsets
    inv_freq = 1.0 / (10000 ** (torch.arange(D // 2, dtype=torch.float32) / (D // 2)))
    ang = pos[:, :, None] * inv_freq
    y = rp.apply_rope_triton(x, ang.cos(), ang.sin())
    assert y.dtype == dtype and y.shape == (B, T, H, D)
    close(y, rp.apply_rope_ref(x, ang.cos(), ang.sin()), dtype)
    # cos/sin shared by the batch through expand() (stride 0 on B)
    c, s = ang[:1].cos().expand(B, T, D // 2), ang[:1].sin().expand(B, T, D // 2)
    close(rp.apply_rope_triton(x, c, s), rp.apply_rope_ref(x, c, s), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@interpreted
def test_rope_backward_matches_reference(dtype):
    """The rotation's gradient (the same kernel with sin negated) against autograd through the reference, on a
    strided view as model.py passes it."""
    g = torch.Generator().manual_seed(12)
    B, T, H, D = 2, 5, 3, 24
    qkv = torch.randn(B, T, 2 * H, D, generator=g).to(dtype).requires_grad_()
    ang = torch.randn(B, T, D // 2, generator=g)
    dy = torch.randn(B, T, H, D, generator=g).to(dtype)
    grads = []
    for rope in (rp._Rope.apply, rp.apply_rope_ref):
        (grad,) = torch.autograd.grad(rope(qkv[:, :, H:], ang.cos(), ang.sin()), qkv, dy)
        grads.append(grad)
    close(grads[0], grads[1], dtype)
    assert (grads[0][:, :, :H] == 0).all()


def test_rope_reference_is_rotate_half():
    """The spec itself against the textbook rotate-half formula (x * cos + rotate_half(x) * sin)."""
    x = torch.randn(2, 3, 4, 8)
    c, s = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    cf, sf = torch.cat([c, c], -1)[:, :, None], torch.cat([s, s], -1)[:, :, None]
    rot = torch.cat([-x[..., 4:], x[..., :4]], -1)
    torch.testing.assert_close(rp.apply_rope_ref(x, c, s), x * cf + rot * sf)


# ---------------------------------------------------------------- decode attention
def _cache(g, dtype, Bmax=5, Hkv=2, L=40, D=24):
    return (torch.randn(Bmax, Hkv, L, D, generator=g).to(dtype), torch.randn(Bmax, Hkv, L, D, generator=g).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_n", [None, 16])  # length 33 takes one block / three blocks
@interpreted
def test_decode_attention_gqa_ragged_rows(dtype, block_n):
    g = torch.Generator().manual_seed(3)
    k, v = _cache(g, dtype)
    q = torch.randn(3, 4, 24, generator=g).to(dtype)  # GQA 4 query heads : 2 kv heads, head_dim 24
    rows, lengths = torch.tensor([4, 0, 2]), torch.tensor([1, 5, 33])
    out = da.decode_attention_triton(q, k, v, rows, lengths, block_n=block_n)
    assert out.dtype == dtype and out.shape == q.shape
    close(out, da.decode_attention_ref(q, k, v, rows, lengths), dtype)


@pytest.mark.parametrize("hq,hkv", [(3, 3), (6, 2)])  # plain MHA; a group of 3 (not a power of two)
@interpreted
def test_decode_attention_group_sizes_and_scale(hq, hkv):
    """Also int32 rows/lengths and a full-length row (40 of 40 slots)."""
    g = torch.Generator().manual_seed(4)
    k, v = _cache(g, torch.float32, Hkv=hkv)
    q = torch.randn(2, hq, 24, generator=g)
    rows, lengths = torch.tensor([3, 1], dtype=torch.int32), torch.tensor([40, 17], dtype=torch.int32)
    out = da.decode_attention_triton(q, k, v, rows, lengths, scale=0.3, block_n=16)
    close(out, da.decode_attention_ref(q, k, v, rows, lengths, scale=0.3), torch.float32)


@interpreted
def test_decode_attention_never_reads_past_length():
    """Cache slots beyond a row's length hold NaN (stale or unwritten memory): the kernel must not touch them."""
    g = torch.Generator().manual_seed(5)
    k, v = _cache(g, torch.float32)
    q = torch.randn(3, 4, 24, generator=g)
    rows, lengths = torch.tensor([4, 0, 2]), torch.tensor([1, 5, 33])
    expected = da.decode_attention_ref(q, k, v, rows, lengths)
    for r, n in zip(rows.tolist(), lengths.tolist()):
        k[r, :, n:], v[r, :, n:] = float("nan"), float("nan")
    for r in {0, 1, 2, 3, 4} - set(rows.tolist()):
        k[r], v[r] = float("nan"), float("nan")
    close(da.decode_attention_triton(q, k, v, rows, lengths, block_n=16), expected, torch.float32)


def test_decode_attention_reference_is_sdpa():
    """The spec itself against torch's scaled_dot_product_attention, one row at a time."""
    g = torch.Generator().manual_seed(6)
    k, v = _cache(g, torch.float32)
    q = torch.randn(3, 4, 24, generator=g)
    rows, lengths = torch.tensor([4, 0, 2]), torch.tensor([1, 5, 33])
    out = da.decode_attention_ref(q, k, v, rows, lengths)
    for i, (r, n) in enumerate(zip(rows.tolist(), lengths.tolist())):
        kk, vv = (t[r, :, :n].repeat_interleave(2, dim=0) for t in (k, v))
        want = F.scaled_dot_product_attention(q[i][:, None], kk, vv)[:, 0]
        torch.testing.assert_close(out[i], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [[4, 0, 2], [1, 2, 3]])   # scattered rows (a copy), consecutive ones (a view)
def test_decode_attention_cpu_paths(dtype, rows):
    """The CPU paths against the spec: in fp32 decode_attention is the reference itself (a run's numbers are
    what they were), in bf16 torch's fused attention, one rounding step from the reference's fp32 math."""
    g = torch.Generator().manual_seed(8)
    k, v = _cache(g, dtype, Hkv=3)
    q = torch.randn(3, 6, 24, generator=g).to(dtype)
    rows, lengths = torch.tensor(rows), torch.tensor([1, 5, 33])
    want = da.decode_attention_ref(q, k, v, rows, lengths)
    got = da.decode_attention(q, k, v, rows, lengths)
    assert got.dtype == dtype and got.shape == q.shape
    if dtype == torch.float32:
        assert torch.equal(got, want)
    close(da.decode_attention_sdpa(q, k, v, rows, lengths), want, dtype)
    for i, (r, n) in enumerate(zip(rows.tolist(), lengths.tolist())):   # the spec, one row at a time
        kk, vv = (t[r, :, :n].float().repeat_interleave(2, dim=0) for t in (k, v))
        close(got[i], F.scaled_dot_product_attention(q[i].float()[:, None], kk, vv)[:, 0].to(dtype), dtype)
    span = da.ReadSpan(rows, torch.tensor([1, 7, 3]))
    view = span.take(k)
    assert torch.equal(view, k[rows, :, :7])
    assert (view.data_ptr() == k[1].data_ptr()) == (rows.tolist() == [1, 2, 3])   # consecutive rows: no copy
    assert torch.equal(da.decode_attention(q, k, v, rows, lengths, span=da.ReadSpan(rows, lengths)), got)


# ---------------------------------------------------------------- selective log-softmax
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", [None, 256])  # V = 1000 in one block / four blocks
@interpreted
def test_selective_log_softmax_forward_and_backward(dtype, block):
    g = torch.Generator().manual_seed(7)
    N, V = 6, 1000
    base = (4 * torch.randn(N, V, generator=g)).to(dtype)
    targets = torch.randint(0, V, (N,), generator=g)
    targets[0] = V - 1  # the last, partially filled block
    grad_out = torch.randn(N, generator=g)
    a, b = base.clone().requires_grad_(), base.clone().requires_grad_()
    out = ls.selective_log_softmax_triton(a, targets, block=block)
    ref = ls.selective_log_softmax_ref(b, targets)
    assert out.dtype == torch.float32 and out.shape == (N,)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 if dtype == torch.float32 else 1e-4)
    (out * grad_out).sum().backward()
    (ref * grad_out).sum().backward()
    assert a.grad.dtype == dtype
    close(a.grad, b.grad, dtype)


@interpreted
def test_selective_log_softmax_masked_logits_and_strided_rows():
    """Constrained decoding masks logits to -inf, sometimes a whole leading block; rows may be a view."""
    g = torch.Generator().manual_seed(8)
    full = torch.randn(5, 1100, generator=g)
    full[:, :300] = float("-inf")  # block 0 (256 wide) entirely masked
    full[2, 600:] = float("-inf")
    targets = torch.tensor([300, 999, 450, 512, 700])
    a, b = full.clone().requires_grad_(), full.clone().requires_grad_()
    out = ls.selective_log_softmax_triton(a[:, :1000], targets, block=256)  # row stride 1100
    ref = ls.selective_log_softmax_ref(b[:, :1000], targets)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    out.sum().backward()
    ref.sum().backward()
    assert torch.isfinite(a.grad).all()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


def test_selective_log_softmax_reference_is_log_softmax_gather():
    """The spec itself against torch's log_softmax and a hand-computed value."""
    x = torch.randn(4, 9)
    t = torch.tensor([0, 8, 3, 3])
    torch.testing.assert_close(ls.selective_log_softmax_ref(x, t), x.log_softmax(-1)[torch.arange(4), t])
    uniform = torch.zeros(1, 8)
    torch.testing.assert_close(ls.selective_log_softmax_ref(uniform, torch.tensor([5])), torch.tensor([-math.log(8)]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_backward_in_place_is_the_references_bit_for_bit(dtype):
    """What a CPU update runs (the dispatch with a gradient wanted) against autograd through the reference: the
    same log-probs and the same gradient bits, signed zeros included, with masked (-inf) logits, a target
    twice and a row's gradient weight of zero, over rows enough for blocks of `_ROWS` and a short last one; and a
    hand check of g * (onehot - softmax) on one row."""
    n = 2 * ls._ROWS + 5
    x = (torch.randn(n, 3000) * 4).to(dtype)
    x[0, :40] = float("-inf")
    t = torch.cat([torch.tensor([40, 7, 7, 2999, 0, 123]), torch.randint(0, 3000, (n - 6,))])
    g = torch.cat([torch.tensor([0.5, -1.0, 2.0, 0.0, 1.5, -0.25]), torch.randn(n - 6)])
    got, want = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = ls.selective_log_softmax(got, t)
    assert type(out.grad_fn).__name__ == "_InPlaceBackwardBackward"
    (out * g).sum().backward()
    (ls.selective_log_softmax_ref(want, t) * g).sum().backward()
    assert torch.equal(out, ls.selective_log_softmax_ref(x, t))
    assert torch.equal(got.grad, want.grad) and torch.equal(got.grad.signbit(), want.grad.signbit())
    p = x[1].float().softmax(-1)
    torch.testing.assert_close(got.grad[1].float(), -1.0 * (F.one_hot(t[1], 3000).float() - p),
                               rtol=1e-2 if dtype == torch.bfloat16 else 1e-6, atol=1e-3 if dtype == torch.bfloat16 else 1e-7)


# ---------------------------------------------------------------- dispatch and bad input
def test_dispatch_uses_reference_on_cpu(monkeypatch):
    """model.py calls the dispatch functions; on CPU they must take the torch path (the Triton one would
    run in the interpreter here, very slowly) and give the reference's exact result."""
    def boom(*a, **k):
        raise AssertionError("Triton path taken for CPU tensors")
    for mod, name in ((rn, "rmsnorm_triton"), (rp, "apply_rope_triton"), (da, "decode_attention_triton"),
                      (ls, "selective_log_softmax_triton")):
        monkeypatch.setattr(mod, name, boom, raising=False)  # absent without Triton
    x, w = torch.randn(3, 77), torch.randn(77)
    assert torch.equal(rn.rmsnorm(x, w, 1e-6), rn.rmsnorm_ref(x, w, 1e-6))
    x, c, s = torch.randn(2, 3, 4, 24), torch.randn(2, 3, 12), torch.randn(2, 3, 12)
    assert torch.equal(rp.apply_rope(x, c, s), rp.apply_rope_ref(x, c, s))
    q, k, v = torch.randn(2, 4, 24), torch.randn(3, 2, 9, 24), torch.randn(3, 2, 9, 24)
    rows, lengths = torch.tensor([2, 0]), torch.tensor([9, 3])
    assert torch.equal(da.decode_attention(q, k, v, rows, lengths), da.decode_attention_ref(q, k, v, rows, lengths))
    logits, t = torch.randn(4, 50, requires_grad=True), torch.tensor([1, 2, 3, 49])
    out = ls.selective_log_softmax(logits, t)
    assert torch.equal(out, ls.selective_log_softmax_ref(logits, t)) and out.requires_grad


@pytest.mark.parametrize("call,match", [
    (lambda: rn.rmsnorm_triton(torch.ones(2, 8), torch.ones(7), 1e-6), "weight has shape"),
    (lambda: rp.apply_rope_triton(torch.ones(1, 2, 3, 7), torch.ones(1, 2, 3), torch.ones(1, 2, 3)), "even D"),
    (lambda: rp.apply_rope_triton(torch.ones(1, 2, 3, 8), torch.ones(1, 2, 3), torch.ones(1, 2, 4)), "cos has shape"),
    (lambda: da.decode_attention_triton(torch.ones(1, 3, 8), torch.ones(1, 2, 4, 8), torch.ones(1, 2, 4, 8),
                                        torch.tensor([0]), torch.tensor([1])), "multiple of kv heads"),
    (lambda: ls.selective_log_softmax_triton(torch.ones(3, 10), torch.tensor([1, 2])), "targets"),
    (lambda: ls.selective_log_softmax_triton(torch.ones(2, 10), torch.tensor([1.0, 2.0])), "integer"),
])
@needs_triton
def test_bad_input_is_a_clear_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---------------------------------------------------------------- without Triton
NO_TRITON = """
import importlib.abc, sys
class NoTriton(importlib.abc.MetaPathFinder):  # a machine without Triton, e.g. a Mac
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "triton":
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, NoTriton())
"""

RUN_MODEL = """
import importlib, json, torch
import model
from small.tiny import tiny_model
torch.manual_seed(0)
m = tiny_model(seed=0)
x = torch.randint(0, 256, (2, 20))
with torch.no_grad():
    logits = m(x)[:, -1]
out = model.generate(m, [[1, 2, 3], [4, 5, 6, 7, 8]], 8, seed=0)
lp = model.token_logprobs(m, x, torch.ones_like(x, dtype=torch.bool))
lp.sum().backward()
absent = [name for mod, name in (("rmsnorm", "rmsnorm_triton"), ("rope", "apply_rope_triton"),
          ("decode_attention", "decode_attention_triton"), ("logsoftmax", "selective_log_softmax_triton"))
          if not hasattr(importlib.import_module("ops." + mod), name)]
print(json.dumps({"logits": logits.tolist(), "tokens": [s.tokens for s in out], "logprobs": lp.tolist(),
                  "grad": m.embed_tokens.weight.grad.abs().sum().item(), "absent": absent,
                  "triton_loaded": any(k.split(".")[0] == "triton" for k in sys.modules)}))
"""


def _run_model(prelude: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", prelude + "import sys\n" + RUN_MODEL], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_model_runs_without_triton():
    """import triton fails (as on a Mac): ops/ defines only the references, and a forward, generate and
    token_logprobs with its backward give what they give with Triton installed (on CPU both take the
    references)."""
    without = _run_model(NO_TRITON)
    assert not without["triton_loaded"]
    assert len(without["absent"]) == 4
    ref = _run_model("")
    assert ref["absent"] == [] or triton is None
    assert without["tokens"] == ref["tokens"]
    for key in ("logits", "logprobs"):
        torch.testing.assert_close(torch.tensor(without[key]), torch.tensor(ref[key]), rtol=1e-5, atol=1e-5)
    assert without["grad"] > 0 and math.isclose(without["grad"], ref["grad"], rel_tol=1e-5)
