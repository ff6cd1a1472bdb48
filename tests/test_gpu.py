"""The GPU check: `python -m pytest -q tests/test_gpu.py` on any machine with CUDA (skipped elsewhere, but
for a CPU smoke test of `python bench.py gpu`).

With CUDA, conftest.py leaves TRITON_INTERPRET unset, so the Triton kernels compile for the GPU. Checked here:
each compiled kernel against its torch reference in fp32 and bf16 (the odd shapes of tests/test_kernels.py
plus Qwen2.5-0.5B-sized ones); that model.py's dispatch really takes the Triton path on CUDA; greedy
`generate` against transformers' greedy generate on the same tiny random Qwen3; and `token_logprobs`
against a plain log-softmax recomputation and against the sampler's own log-probs.
"""
import importlib
import re

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.utils import logging as hf_logging

import bench
from ops._triton import InterpretedFunction, triton
from model import ByteTokenizer, Session, Transformer, generate, token_logprobs
from sampling import Sampling
from small.tiny import init_weights, tiny_model
from small.grammar import Constraint

cuda = pytest.mark.skipif(not torch.cuda.is_available() or triton is None, reason="needs a CUDA GPU and Triton")
hf_logging.set_verbosity_error()
hf_logging.disable_progress_bar()

da = importlib.import_module("ops.decode_attention")
ls = importlib.import_module("ops.logsoftmax")
rn = importlib.import_module("ops.rmsnorm")
rp = importlib.import_module("ops.rope")

DEV = "cuda"
DTYPES = [torch.float32, torch.bfloat16]


def randn(*shape, g, dtype=torch.float32, scale=1.0):
    """Drawn on the CPU (the same numbers on every machine), then moved to the GPU."""
    return (scale * torch.randn(*shape, generator=g)).to(DEV, dtype)


def close(actual, expected, dtype):
    """fp32: the GPU's exp/rsqrt approximations and another summation order (1e-4 relative, 1e-5 absolute);
    bf16: one bf16 rounding step apart at most (both sides compute in fp32 and round once)."""
    if dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)
    else:
        torch.testing.assert_close(actual, expected, rtol=1.6e-2, atol=1e-2)


@cuda
def test_kernels_are_compiled_not_interpreted():
    for kernel in (rn._rmsnorm_kernel, rp._rope_kernel, da._decode_attention_kernel,
                   ls._logsoftmax_fwd_kernel, ls._logsoftmax_bwd_kernel):
        assert not isinstance(kernel, InterpretedFunction), \
            "TRITON_INTERPRET is set: unset it to run this file on the GPU's compiled kernels"


# ---------------------------------------------------------------- kernels against their references
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols,block", [(3, 77, None), (3, 77, 16), (4096, 896, None), (5, 10000, None)])
@cuda
def test_rmsnorm(dtype, rows, cols, block):
    """Odd widths, a five-chunk loop, the 0.5B hidden size, and a row wider than the largest block (8192)."""
    g = torch.Generator().manual_seed(0)
    x, w = randn(rows, cols, g=g, dtype=dtype, scale=3), randn(cols, g=g)
    y = rn.rmsnorm_triton(x, w, 1e-6, block=block)
    assert y.dtype == dtype and y.shape == x.shape
    close(y, rn.rmsnorm_ref(x, w, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 77), (8192, 896), (2, 9, 14, 128)])
@cuda
def test_rmsnorm_backward(dtype, shape):
    """dx and dw against autograd through the reference: odd width, the 0.5B training batch's rows, Qwen3's
    per-head norm."""
    g = torch.Generator().manual_seed(4)
    x = randn(*shape, g=g, dtype=dtype, scale=3).requires_grad_()
    w = randn(shape[-1], g=g).requires_grad_()
    dy = randn(*shape, g=g, dtype=dtype)
    ours, ref = (torch.autograd.grad(f(x, w, 1e-6), (x, w), dy) for f in (rn._RMSNorm.apply, rn.rmsnorm_ref))
    close(ours[0], ref[0], dtype)
    torch.testing.assert_close(ours[1], ref[1], rtol=1e-3 if dtype == torch.float32 else 2e-2, atol=1e-3)


@pytest.mark.parametrize("dtype", DTYPES)
@cuda
def test_rope_backward(dtype):
    g = torch.Generator().manual_seed(5)
    x = randn(4, 33, 16, 64, g=g, dtype=dtype).requires_grad_()
    ang = randn(4, 33, 32, g=g, scale=3)
    dy = randn(4, 33, 14, 64, g=g, dtype=dtype)
    ours, ref = (torch.autograd.grad(f(x[:, :, 2:], ang.cos(), ang.sin()), x, dy)[0]
                 for f in (rp._Rope.apply, rp.apply_rope_ref))
    close(ours, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@cuda
def test_rmsnorm_per_head_strided_view(dtype):
    """Qwen3's q/k norm: each head of a transposed [B, H, T, D] view."""
    g = torch.Generator().manual_seed(1)
    x, w = randn(2, 3, 14, 64, g=g, dtype=dtype).transpose(1, 2), randn(64, g=g)
    close(rn.rmsnorm_triton(x, w, 1e-6), rn.rmsnorm_ref(x, w, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,T,H,D", [(2, 5, 3, 24), (8, 128, 14, 64)])
@cuda
def test_rope_on_a_fused_projection_view(dtype, B, T, H, D):
    g = torch.Generator().manual_seed(2)
    x = randn(B, T, 3 * H + 1, D, g=g, dtype=dtype)[:, :, 1:1 + H]  # non-contiguous, as q/k views are
    pos = torch.arange(T, dtype=torch.float32)[None, :] + torch.arange(B, dtype=torch.float32)[:, None] * 7
    inv_freq = 1.0 / (1e6 ** (torch.arange(D // 2, dtype=torch.float32) / (D // 2)))
    ang = (pos[:, :, None] * inv_freq).to(DEV)
    y = rp.apply_rope_triton(x, ang.cos(), ang.sin())
    assert y.dtype == dtype and y.shape == (B, T, H, D)
    close(y, rp.apply_rope_ref(x, ang.cos(), ang.sin()), dtype)


DECODE_SHAPES = {  # (Bmax, Hq, Hkv, L, D, rows, lengths, block_n)
    "odd, one block": (5, 4, 2, 40, 24, [4, 0, 2], [1, 5, 33], None),
    "odd, three blocks": (5, 4, 2, 40, 24, [4, 0, 2], [1, 5, 33], 16),
    "group of 3, full row": (4, 6, 2, 40, 24, [3, 1], [40, 17], 16),
    "0.5B: group of 7": (32, 14, 2, 1024, 64, list(range(31, -1, -2)), None, None),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", list(DECODE_SHAPES))
@cuda
def test_decode_attention(dtype, shape):
    """Ragged lengths, rows addressed out of order; cache slots past each length hold NaN and must not be read."""
    Bmax, Hq, Hkv, L, D, rows, lengths, block_n = DECODE_SHAPES[shape]
    g = torch.Generator().manual_seed(3)
    k, v = randn(Bmax, Hkv, L, D, g=g, dtype=dtype), randn(Bmax, Hkv, L, D, g=g, dtype=dtype)
    q = randn(len(rows), Hq, D, g=g, dtype=dtype)
    if lengths is None:
        lengths = torch.randint(1, L + 1, (len(rows),), generator=g).tolist()
    rows_t, lengths_t = torch.tensor(rows, device=DEV), torch.tensor(lengths, device=DEV)
    expected = da.decode_attention_ref(q, k, v, rows_t, lengths_t)
    for r, n in zip(rows, lengths):
        k[r, :, n:], v[r, :, n:] = float("nan"), float("nan")
    out = da.decode_attention_triton(q, k, v, rows_t, lengths_t, block_n=block_n)
    assert out.dtype == dtype and out.shape == q.shape
    close(out, expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@cuda
def test_decode_attention_long_cache(dtype):
    """SmolLM2's heads at batch 16 on a 4096-position cache, every row a different length, slots past it NaN:
    the same numbers as the reference."""
    g = torch.Generator().manual_seed(8)
    k, v = randn(16, 3, 4096, 64, g=g, dtype=dtype), randn(16, 3, 4096, 64, g=g, dtype=dtype)
    q = randn(16, 9, 64, g=g, dtype=dtype)
    rows_t = torch.arange(15, -1, -1, device=DEV)
    lengths_t = torch.tensor([1, 63, 64, 65, 1023, 1024, 1025, 2048, 3000, 4095, 4096, 7, 500, 2500, 3500, 4000],
                             device=DEV)
    expected = da.decode_attention_ref(q, k, v, rows_t, lengths_t)
    for r, n in zip(rows_t.tolist(), lengths_t.tolist()):
        k[r, :, n:], v[r, :, n:] = float("nan"), float("nan")
    close(da.decode_attention_triton(q, k, v, rows_t, lengths_t), expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N,V,block", [(6, 1000, None), (6, 1000, 256), (64, 151936, None)])
@cuda
def test_selective_log_softmax_forward_and_backward(dtype, N, V, block):
    g = torch.Generator().manual_seed(4)
    base = randn(N, V, g=g, dtype=dtype, scale=4)
    targets = torch.randint(0, V, (N,), generator=g).to(DEV)
    targets[0] = V - 1  # the last, partially filled block
    grad_out = randn(N, g=g)
    a, b = base.clone().requires_grad_(), base.clone().requires_grad_()
    out = ls.selective_log_softmax_triton(a, targets, block=block)
    ref = ls.selective_log_softmax_ref(b, targets)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)  # fp32 out: only the summation order differs
    (out * grad_out).sum().backward()
    (ref * grad_out).sum().backward()
    assert a.grad.dtype == dtype
    close(a.grad, b.grad, dtype)


@cuda
def test_selective_log_softmax_masked_leading_block():
    """Constrained decoding masks logits to -inf, here the whole first block; rows are a strided view."""
    g = torch.Generator().manual_seed(5)
    full = randn(5, 1100, g=g)
    full[:, :300] = float("-inf")
    targets = torch.tensor([300, 999, 450, 512, 700], device=DEV)
    a, b = full.clone().requires_grad_(), full.clone().requires_grad_()
    out = ls.selective_log_softmax_triton(a[:, :1000], targets, block=256)
    ref = ls.selective_log_softmax_ref(b[:, :1000], targets)
    close(out, ref, torch.float32)
    out.sum().backward()
    ref.sum().backward()
    assert torch.isfinite(a.grad).all()
    close(a.grad, b.grad, torch.float32)


# ---------------------------------------------------------------- the model on the GPU
@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A tiny random Qwen3 checkpoint written by transformers. Init std 0.3 makes next-token distributions
    peaky, so greedy has clear winners (as in tests/test_generate.py)."""
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=89, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
                      max_position_embeddings=512, eos_token_id=None, pad_token_id=0, initializer_range=0.3)
    d = tmp_path_factory.mktemp("qwen3")
    Qwen3ForCausalLM(cfg).save_pretrained(d)
    return d


def _prompts(n, lo, hi, V, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, V, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


@cuda
def test_cuda_dispatch_takes_the_triton_path(ckpt, monkeypatch):
    """Counts the calls into each op's Triton and reference function while model.py decodes and trains on
    CUDA: decoding and token_logprobs' forward and backward use only the Triton kernels."""
    calls = {}
    for mod, op in ((rn, "rmsnorm"), (rp, "apply_rope"), (da, "decode_attention"), (ls, "selective_log_softmax")):
        for name in (f"{op}_triton", f"{op}_ref"):
            real = getattr(mod, name)
            monkeypatch.setattr(mod, name, lambda *a, _real=real, _name=name, **k:
                                calls.__setitem__(_name, calls.get(_name, 0) + 1) or _real(*a, **k))
    ours = Transformer.from_pretrained(ckpt, device=DEV)
    prompts = _prompts(3, 2, 9, 89, seed=1)
    generate(ours, prompts, 6, seed=0, session=Session(ours, 3, 20, graphs=False), rows=[0, 1, 2])
    assert calls.get("rmsnorm_triton", 0) > 0 and calls.get("apply_rope_triton", 0) > 0
    assert calls.get("decode_attention_triton", 0) == 2 * 5  # 2 layers x 5 decode steps after the prefill
    assert not any(calls.get(f"{op}_ref") for op in ("rmsnorm", "apply_rope", "decode_attention")), calls
    calls.clear()
    generate(ours, prompts, 6, seed=0)   # decode graphs: Python runs the step twice to warm up, once to capture
    assert calls.get("decode_attention_triton", 0) == 2 * 3 and not calls.get("decode_attention_ref"), calls
    calls.clear()
    tokens = torch.randint(1, 89, (2, 12), device=DEV)
    token_logprobs(ours, tokens, torch.ones_like(tokens, dtype=torch.bool)).sum().backward()
    # one chunk: its forward, then again when the backward recomputes the checkpointed chunk
    assert calls.get("selective_log_softmax_triton", 0) == 2 and not calls.get("selective_log_softmax_ref"), calls
    # training too: RMSNorm and rope through their Triton backward (the rope's is its forward kernel again)
    assert calls.get("rmsnorm_triton", 0) > 0 and not calls.get("rmsnorm_ref"), calls
    assert calls.get("apply_rope_triton", 0) == 2 * 2 * 2 and not calls.get("apply_rope_ref"), calls


# Greedy decoding is exact up to near-ties: two implementations of one model round differently, so where the top
# two logits are within that rounding the argmax may legitimately differ, and the continuations diverge after
# it. Criterion: each row equals transformers' token for token, or at the first difference (the first token
# included) transformers' own logits put our token within TIE[dtype] of its choice. bf16 logits of size ~5
# are rounded to 1/32, so ties are common there (on CPU, 3 of 6 rows diverge, all at gaps <= 1/16); TIE allows
# 8 such steps. In fp32 at least half the rows must also be exact.
TIE = {torch.float32: 1e-3, torch.bfloat16: 0.25}


@pytest.mark.parametrize("dtype", DTYPES)
@cuda
def test_greedy_generate_equals_transformers_on_cuda(ckpt, dtype):
    ours = Transformer.from_pretrained(ckpt, dtype=dtype, device=DEV)
    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype).to(DEV).eval()
    prompts = _prompts(6, 1, 40, 89, seed=2)
    out = generate(ours, prompts, 16, Sampling(0))
    exact = 0
    for p, s in zip(prompts, out):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p], device=DEV), attention_mask=torch.ones(1, len(p), dtype=torch.long,
                              device=DEV), max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0,
                              output_logits=True, return_dict_in_generate=True)
        want = ref.sequences[0, len(p):].tolist()
        j = next((i for i, (a, b) in enumerate(zip(s.tokens, want)) if a != b), None)
        if j is None:
            assert len(s.tokens) == len(want) == 16
            exact += 1
            continue
        z = ref.logits[j][0].float()
        gap = (z[want[j]] - z[s.tokens[j]]).item()
        assert gap <= TIE[dtype], f"{dtype} row diverges at token {j} where transformers' logit gap is {gap:.4f}"
    assert dtype == torch.bfloat16 or exact >= len(prompts) // 2, f"only {exact} of {len(prompts)} rows are exact"


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-4), (torch.bfloat16, 6e-2)])
@cuda
def test_token_logprobs_equals_plain_recomputation_on_cuda(ckpt, dtype, atol):
    """Against log_softmax(model(tokens)) gathered at the targets: values and (fp32) the gradient. bf16: both
    sides take bf16 logits, so they differ by about one bf16 rounding of a logit (2^-8 of its size)."""
    ours = Transformer.from_pretrained(ckpt, dtype=dtype, device=DEV)
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 89, (4, 50), generator=g).to(DEV)
    mask = (torch.rand(4, 50, generator=g) < 0.7).to(DEV)
    mask[:, 0] = False
    lp = token_logprobs(ours, tokens, mask, chunk_size=16)
    plain = torch.log_softmax(ours(tokens).float(), -1)[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0]
    m = mask[:, 1:]
    torch.testing.assert_close(lp[:, 1:][m], plain[m], rtol=0, atol=atol)
    assert (lp[~mask] == 0).all()
    if dtype == torch.float32:
        w = ours.layers[0].self_attn.qkv_proj.weight
        (g1,) = torch.autograd.grad(lp.sum(), w)
        (g2,) = torch.autograd.grad(plain[m].sum(), w)
        torch.testing.assert_close(g1, g2, rtol=1e-3, atol=1e-5)


@cuda
def test_sampled_logprobs_equal_token_logprobs_on_cuda():
    """On-policy, the training recomputation reproduces what the CUDA sampler reported: same temperature,
    top-k, top-p and constraint masks; the decode path (Triton) and the training path (references + Triton
    log-softmax) agree."""
    tiny = init_weights(tiny_model(seed=1), seed=1, std=0.3).to(DEV)
    tok = ByteTokenizer()
    prompts = [tok.encode(t) for t in ("<|im_start|>user\nwhere?<|im_end|>\n", "go ", "a", "the map is ##")]
    cons = [Constraint.from_strings(tok, ["north", "south", "n", "ne"]), None,
            Constraint.from_strings(tok, ["add(", "update(", "none"], free_after=True), None]
    sampling = Sampling(0.7, top_k=20, top_p=0.9)
    out = generate(tiny, prompts, 24, sampling, constraint=cons, seed=0)
    L = max(len(p) + len(s.tokens) for p, s in zip(prompts, out))
    toks = torch.zeros(len(prompts), L, dtype=torch.long)
    mask = torch.zeros(len(prompts), L, dtype=torch.bool)
    allowed = []
    for b, (p, s) in enumerate(zip(prompts, out)):
        toks[b, :len(p) + len(s.tokens)] = torch.tensor(p + s.tokens)
        mask[b, len(p):len(p) + len(s.tokens)] = True
        allowed.append({len(p) + j: a for j, a in enumerate(s.allowed) if a is not None})
    lp = token_logprobs(tiny, toks.to(DEV), mask.to(DEV), sampling, allowed=allowed).cpu()
    for b, (p, s) in enumerate(zip(prompts, out)):
        torch.testing.assert_close(lp[b, len(p):len(p) + len(s.tokens)], torch.tensor(s.logprobs), rtol=0, atol=1e-4)


# ---------------------------------------------------------------- decode graphs (cudagraphs.py)
@cuda
def test_decode_graphs_equal_eager_decoding_on_cuda():
    """tests/test_generate.py's script on real CUDA graphs (fp32): the same greedy and seeded replies and
    log-probs as eager decoding, batches padded to their buckets, the cache growing under the graphs, padding
    writing no live slot; every decode step a replay."""
    from test_generate import graph_vs_eager
    tiny = init_weights(tiny_model(seed=1), seed=1, std=0.3).to(DEV)
    graph, decodes, captures = graph_vs_eager(tiny)
    assert graph.graphs.replays == decodes > 20 and captures >= 3


@cuda
def test_decode_graphs_in_bf16_give_eager_logits():
    """A bf16 model fed the same tokens through a graph session and an eager one: each step's logits agree to
    bf16 rounding (no sampling, so no near-tie can make the two diverge); 11 rows padded to 16."""
    tiny = init_weights(tiny_model(seed=2), seed=2, std=0.3).to(DEV, torch.bfloat16)
    prompts = _prompts(11, 1, 30, 250, seed=5)
    rows = list(range(11))
    sessions = [Session(tiny, 11, 64, graphs=g) for g in (True, False)]
    first = [s.prefill(rows, prompts) for s in sessions]
    torch.testing.assert_close(first[0], first[1])
    g = torch.Generator().manual_seed(6)
    for _ in range(8):
        tokens = torch.randint(1, 250, (11,), generator=g).to(DEV)
        a, b = (s.decode(torch.tensor(rows, device=DEV), tokens) for s in sessions)
        torch.testing.assert_close(a, b, rtol=0.02, atol=0.05)
    assert sessions[0].graphs.replays == 8


@cuda
def test_seeded_sampling_with_graphs_repeats_and_a_thread_decodes_beside():
    """The same seed gives the same samples through graphs; while the main thread captures and replays graphs,
    another thread (the background distillation) decodes eagerly, its default off the main thread, and each
    gets what it gets alone (5 rounds, fresh sessions, so every round captures again)."""
    import threading
    tiny = init_weights(tiny_model(seed=1), seed=1, std=0.3).to(DEV)
    jobs = [(_prompts(6, 1, 20, 250, seed=s), s) for s in (7, 8)]
    alone = [generate(tiny, p, 24, Sampling(1.0), seed=s) for p, s in jobs]
    again = generate(tiny, jobs[0][0], 24, Sampling(1.0), seed=7)
    assert [x.tokens for x in again] == [x.tokens for x in alone[0]]
    assert [x.logprobs for x in again] == [x.logprobs for x in alone[0]]
    sessions, start = [], threading.Barrier(2)

    def work(i, out):
        start.wait()
        for _ in range(5):
            session = Session(tiny, 6, 64)
            sessions.append(session)
            out.append(generate(tiny, jobs[i][0], 24, Sampling(1.0), seed=jobs[i][1], session=session,
                                rows=list(range(6))))
    outs = [[], []]
    beside = threading.Thread(target=work, args=(1, outs[1]))
    beside.start()
    work(0, outs[0])
    beside.join()
    for i in range(2):
        assert len(outs[i]) == 5 and all([x.tokens for x in o] == [x.tokens for x in alone[i]] for o in outs[i])
    assert sum(s.graphs is not None for s in sessions) == 5   # the main thread's


# ---------------------------------------------------------------- bench.py gpu
def test_bench_gpu_runs_on_cpu_small(capsys):
    """The benchmark's own code on a tiny shape on CPU: every row of its table has both sides' figures."""
    threads = torch.get_num_threads()
    try:
        bench.main(["gpu", "--device", "cpu", "--small", "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    for key in ("generate tok/s", "decode tok/s", "train positions/s", "decode share of peak %"):
        row = re.search(rf"{re.escape(key)}\s+(\S+)\s+(\S+)\s+(\S+)x", out)
        assert row and all(float(v) > 0 for v in row.groups()), (key, out)
    assert re.search(r"generate peak MiB\s+-", out)  # memory is measured on CUDA only
    steps = re.findall(r"small\s+(\d+)\s+(\S+)\s+-\s+-\s+(\S+)\s+(\S+)", out)   # decode step: roof, eager, hf
    assert [int(b) for b, *_ in steps] == [1, 4] and all(float(v) > 0 for _, *vs in steps for v in vs), out


def test_train_figures_are_the_median_first_against_both_peaks_with_real_tokens():
    """The MFU arithmetic on hand-computed numbers: 2 TFLOP a step, steps of 50/40/100/60/50 ms (median 50,
    best 40), 12 real tokens in 16 positions; then the H200 figures of results/gpu/h200-call3.txt recomputed."""
    tokens = torch.tensor([[3, 4, 5, 6, 0, 0, 0, 0], [7, 8, 9, 1, 2, 3, 4, 5]])
    assert bench._real_tokens(tokens) == 12
    r = bench._train_figures(2e12, [0.05, 0.04, 0.10, 0.06, 0.05], tokens.numel(), bench._real_tokens(tokens),
                             {"datasheet": 1000e12, "matmul": 800e12, "unknown": None})
    assert (r["median s"], r["best s"], r["worst s"], r["repeats"]) == (0.05, 0.04, 0.10, 5)
    assert r["positions/s"] == pytest.approx(320) and r["real tokens/s"] == pytest.approx(240)
    assert r["padding %"] == pytest.approx(25)
    assert r["MFU % datasheet median"] == pytest.approx(4.0) and r["MFU % datasheet best"] == pytest.approx(5.0)
    assert r["MFU % matmul median"] == pytest.approx(5.0) and r["MFU % matmul best"] == pytest.approx(6.25)
    assert r["MFU % unknown median"] is None and r["MFU % unknown best"] is None
    assert bench._datasheet_peak("NVIDIA H200") == 989.5e12 and bench._datasheet_peak("cpu") is None
    # call 3's probe: 22.61 T a step in a median 79.66 ms; the blocks, 18.67 T, in 47.98 ms, against its 790 TFLOP/s
    assert bench._mfu(22.61e12, 79.66e-3, 989.5e12) == pytest.approx(28.68, abs=0.01)
    assert bench._mfu(18.67e12, 47.98e-3, 790e12) == pytest.approx(49.26, abs=0.01)   # not 59.6


def test_cpu_roofs_are_the_larger_of_bytes_and_flops_on_hand_computed_numbers():
    """A 2-layer Llama (hidden 8, 2 heads of 4, 1 kv head, MLP 16, vocab 100, tied): 1,152 block matmul weights,
    lm_head 800, 1,992 parameters in all. At 1 MB/s and 1 MFLOP/s, decode at batch 2 over 10 positions reads
    (1,992 + 320 cached) x 4 bytes, 9.248 ms, against 2 x (2 x 1,952 + 640 attention) FLOPs, 9.088 ms; a prefill
    of 2 x 10 tokens does 20 x (2 x 1,152 + 320) + 2 x 2 x 800 FLOPs (lm_head at the last tokens), 55.68 ms."""
    from model import ModelConfig, Transformer
    model = Transformer(ModelConfig(architecture="LlamaForCausalLM", vocab_size=100, hidden_size=8,
                                    intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                                    num_key_value_heads=1, head_dim=4))
    assert model.num_params() == 1992
    assert bench._decode_roof_ms(model, 2, 10, 1e6, 1e6) == pytest.approx((9.248, 9.088))
    assert bench._prefill_roof_ms(model, 2, 10, 1e6, 1e6) == pytest.approx((9.248, 55.68))
    assert bench._best_limits([(1.0, 5.0), (3.0, 2.0)]) == (3.0, 5.0)   # each figure's best on its own
    text = "processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 avx512f amx_tile\n\nprocessor\t: 1\n"
    assert bench._cpuinfo(text) == ("Some CPU", ["avx2", "avx512f"])


def test_train_batch_is_seeded_and_its_real_tokens_are_the_unpadded_positions():
    """The bench's batch no longer depends on the global RNG (three H200 calls timed three batches); the
    real tokens of it are the scored ones plus each row's unscored first eighth."""
    torch.manual_seed(1)
    t1, m1 = bench._train_batch(100, 8, 64)
    torch.manual_seed(2)
    t2, m2 = bench._train_batch(100, 8, 64)
    assert torch.equal(t1, t2) and torch.equal(m1, m2)
    assert not torch.equal(bench._train_batch(100, 8, 64, seed=1)[0], t1)
    assert bench._real_tokens(t1) == int(m1.sum()) + 8 * 64 // 8 < t1.numel()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_bench_gpu_without_cuda_is_a_one_line_error():
    with pytest.raises(SystemExit) as e:
        bench.main(["gpu"])
    msg = str(e.value)
    assert "no CUDA device" in msg and "--device cpu --small" in msg and "\n" not in msg


@pytest.mark.parametrize("fsdp", [False, True])
@cuda
def test_two_training_iterations_on_cuda(tmp_path, fsdp):
    """train.py end to end on the GPU with HF checkpoints (the actor's replies constrained to the moves, so
    some episodes succeed and the update has work; a free-text extractor; a decoder embedder): fp32 master
    weights computing in bf16, 2 iterations without and with --fsdp (one rank, blocks checkpointed),
    checkpoints written (with --fsdp also the sharded DCP save)."""
    import parallel
    import train
    from test_train import read_metrics, write_hf_checkpoint
    for name, seed in (("actor", 0), ("extractor", 1), ("embedder", 2)):
        write_hf_checkpoint(str(tmp_path / name), seed)
    out = tmp_path / "run"
    run = train.main(["--tasks", "room", "--no-free-text", "--actor", str(tmp_path / "actor"), "--extractor",
                      str(tmp_path / "extractor"), "--embedder", str(tmp_path / "embedder"), "--iters", "2",
                      "--eval-every", "1", "--eval-episodes", "2", "--groups", "2", "--group-size", "4",
                      "--max-steps", "8", "--max-reply-tokens", "24", "--extractor-reply-tokens", "32",
                      "--warmup", "0", "--extractor-batch", "2", "--out", str(out),
                      *(["--fsdp", "--checkpoint-blocks"] if fsdp else [])])
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1] and "actor/loss" in rows[0] and "eval/room/success_noexp" in rows[1]
    assert run.actor.device.type == "cuda" and parallel.is_sharded(run.actor) == fsdp
    assert {p.dtype for p in run.actor.parameters()} == {torch.float32}
    assert parallel.compute_dtype(run.actor) == torch.bfloat16
    assert (out / "ckpt" / "actor" / "config.json").exists() and (out / "ckpt" / "dcp").exists() == fsdp
