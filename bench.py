"""Benchmarks: each prints our figure beside a reference measured in the same run, and their ratio.

  python bench.py generate  model.generate vs transformers' generate, tokens/s (same random ~25M-param Qwen3
                            checkpoint, or SmolLM2-135M's shape with `--shape smollm2`, in `--dtype`; sampling at
                            temperature 1, every row forced to the full length), the prefill and a decode
                            step timed apart, each beside its roof on this CPU (the larger of the bytes read at
                            the measured read bandwidth and the FLOPs at the measured matmul peak); and a
                            multi-turn session with the KV cache kept across turns vs re-prefilling the history
  python bench.py train     token_logprobs forward + backward vs transformers' forward + log-softmax gather +
                            backward (`--shape`, `--dtype`: bf16 is the update's autocast on fp32 masters): time,
                            peak memory (growth of peak RSS), each side in a fresh process, and the step's model
                            FLOPs as a share of the measured matmul peak (MFU)
  python bench.py bank      ExperienceBank.search p50/p99 (32 queries, 1k/20k/100k entries x 384-d) vs a numpy
                            brute force on the same keys
  python bench.py env       steps/s of envs.py's text wrappers vs the raw MiniHack gym env (same seeds and random
                            actions: the ratio is the cost of the text); Sokoban and WebShop steps/s (no
                            reference; WebShop also its search alone, ms/query)
  python bench.py kernels   each Triton kernel vs its torch reference on the same inputs (CUDA only)
  python bench.py gpu       on one GPU, a Qwen2.5-0.5B-shaped random checkpoint in bf16: generate and decode
                            tokens/s, training tokens/s, its model FLOPs as a share of a large bf16 matmul's
                            (MFU) and peak memory, ours vs transformers; then the decode step (0.5B and
                            SmolLM2-135M shapes, batch 1/8/32/64) with and without decode graphs, beside
                            transformers and as a multiple of the memory roof (CUDA; `--device cpu --small`
                            smoke-tests it)
  python bench.py step      seconds per crl.train_step on the tiny preset, mode crl vs mode grpo (same seeds and
                            groups): the cost of co-evolving the extractor and the bank, split by phase; with
                            `--compare distill`, distillation inline vs on the bank's thread during the actor
                            update; with `--compare memo`, the embedder's memo of texts on vs off (every
                            retrieval key and lesson embedded anew, the path before); with `--compare dtype`,
                            fp32 vs bf16 compute (`--extra "--actor smollm2 --extractor smollm2"` for the
                            preset's models; ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 stand in for a CPU
                            without AVX-512); also under
                            `torchrun --nproc_per_node N bench.py step ...` (DDP)

`python bench.py SUBCOMMAND -h` lists its options.
"""
import argparse
import json
import math
import os
import random
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch


def _timed(fn, cuda=False):
    """(fn's result, wall seconds); with cuda=True the CUDA work fn queued is included."""
    if cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize()
    return out, time.perf_counter() - t


def _timed_peak(fn, device) -> tuple[float, float]:
    """(wall seconds, peak MiB allocated during fn above what was allocated before it); on CUDA only, the
    peak is nan elsewhere."""
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    _, dt = _timed(fn, cuda)
    return dt, (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else float("nan")


def _pct(seconds) -> tuple[float, float]:
    """p50 and p99 in milliseconds."""
    ms = np.asarray(seconds) * 1e3
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def _latency(fn, reps, warmup=3) -> tuple[float, float]:
    """p50 and p99 (ms) of `reps` timed calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    return _pct([_timed(fn)[1] for _ in range(reps)])


# ---------------------------------------------------------------------------------------------------------
# generate / train: model.py against transformers on the same checkpoint

BENCH_CONFIG = dict(architectures=["Qwen3ForCausalLM"], vocab_size=32000, hidden_size=384, intermediate_size=1024,
                    num_hidden_layers=8, num_attention_heads=6, num_key_value_heads=2, head_dim=64,
                    max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True,
                    eos_token_id=None, bos_token_id=None, pad_token_id=0)


def _checkpoint(path: str | None, shape: str = "qwen3-25m") -> str:
    """The benchmark checkpoint at `path` (default: one per shape in the temp directory), written on first use:
    the ~25M Qwen3 (random, our tiny_model's init) or SmolLM2-135M's shape (transformers' random Llama init, bf16)."""
    from small.tiny import tiny_model
    path = path or os.path.join(tempfile.gettempdir(), f"crl_bench_{shape.replace('-', '_')}")
    if not os.path.exists(os.path.join(path, "config.json")):
        if shape == "smollm2":
            _random_checkpoint(SMOLLM2_135M, path, "llama")
        else:
            tiny_model(seed=0, **BENCH_CONFIG).save_pretrained(path)
    return path


CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")   # the flags that decide torch's and oneDNN's kernels


def _cpuinfo(text: str) -> tuple[str, list[str]]:
    """(model name, which of CPU_FLAGS it has) from /proc/cpuinfo's text (its first processor's lines)."""
    fields = dict(line.split(":", 1) for line in text.split("\n\n")[0].splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    have = set(fields.get("flags", "").split())
    return fields.get("model name", "unknown CPU"), [f for f in CPU_FLAGS if f in have]


def _cpu() -> tuple[str, list[str]]:
    try:
        with open("/proc/cpuinfo") as f:
            return _cpuinfo(f.read())
    except OSError:   # not Linux: the name only, the flags unknown
        import platform
        return platform.processor() or platform.machine(), []


def _cpu_kind() -> str:
    """The CPU, its flags of CPU_FLAGS, and what it computes with as torch sees it (ATEN_CPU_CAPABILITY and
    ONEDNN_MAX_CPU_ISA can lower it below the flags)."""
    name, flags = _cpu()
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA")
    return (f"{name} ({' '.join(flags) or 'none of ' + ' '.join(CPU_FLAGS)}), cpu capability "
            f"{torch.backends.cpu.get_cpu_capability()}" + (f", oneDNN ISA <= {isa}" if isa else ""))


def _native_dtype() -> str:
    """bfloat16 where the CPU computes it natively (AVX-512 BF16 or AMX, not held to AVX2), else float32: the
    dtype a run picks with --dtype auto and the CPU targets are set in."""
    held = "AVX2" in os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    native = {"avx512_bf16", "amx_bf16"} & set(_cpu()[1]) and "AVX512" in torch.backends.cpu.get_cpu_capability()
    return "bfloat16" if native and not held else "float32"


def _cpu_limits(n_bytes: int, dtype: torch.dtype) -> tuple[float, float]:
    """(read bytes/s over a buffer of n_bytes, matmul FLOP/s in `dtype`) on this CPU, measured now: what a roof
    is made of. A decode step reads its weights once, so the read is of a buffer as large as they are (the L3
    may hold part of either); the matmul is 2048^3, fewer repeats in fp32 (~8x slower than AMX's bf16)."""
    reps = 20 if dtype == torch.bfloat16 else 4
    return _copy_bandwidth("cpu", n_bytes, reps=5, read=True), _matmul_flops(2048, "cpu", reps, dtype)


def _best_limits(limits: list) -> tuple[float, float]:
    """The best of several _cpu_limits measurements, each figure on its own: a roof is what the CPU can do,
    and a shared machine's other work only lowers a measurement."""
    return max(b for b, _ in limits), max(p for _, p in limits)


def _decode_roof_ms(model, batch: int, context: float, bandwidth: float, peak: float) -> tuple[float, float]:
    """A decode step's two floors, ms: every weight and the K/V cache read once (`_roof_ms`), and its matmul
    and attention FLOPs at `peak` (`_decode_flops_per_token`); its roof is the larger."""
    return (_roof_ms(model, batch, context, bandwidth),
            batch * _decode_flops_per_token(model, context) / peak * 1e3)


def _prefill_roof_ms(model, batch: int, T: int, bandwidth: float, peak: float) -> tuple[float, float]:
    """A prefill's two floors, ms, for `batch` fresh rows of T tokens: every weight read and the K/V cache
    written once; a forward's FLOPs (a third of `_train_flops`' forward + backward) with lm_head at the last
    position of each row only, as Session.prefill computes it."""
    last = torch.zeros(batch, T, dtype=torch.bool)
    last[:, -1] = True
    return _roof_ms(model, batch, T, bandwidth), _train_flops(model, last) / 3 / peak * 1e3


def _quiet_transformers():
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def _hf_model(path, dtype=torch.float32):
    from transformers import AutoModelForCausalLM
    _quiet_transformers()
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


CPU_DECODE_TARGETS = {"float32": 1.5, "bfloat16": 2.0}   # generate's speed, x transformers', on a CPU
# against the CPU's own limits, at SmolLM2's shape in _native_dtype: a decode step at batch 16 at most this many
# times its roof; the update's forward + backward at least this share (%) of the measured matmul peak
CPU_ROOF_TARGET, CPU_TRAIN_MFU_TARGET = 2.0, 35.0


def bench_generate(a):
    from model import Session, Transformer, generate
    from sampling import Sampling
    path = _checkpoint(a.ckpt, a.shape)
    dtype = getattr(torch, a.dtype)
    ours, hf = Transformer.from_pretrained(path, dtype=dtype), _hf_model(path, dtype)
    V = ours.config.vocab_size
    print(f"checkpoint: {a.shape} shape, {ours.num_params() / 1e6:.1f}M params, vocab {V}, {a.dtype}; "
          f"{_cpu_kind()}, torch threads {torch.get_num_threads()}")
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, V, (a.batch, a.prompt), generator=g)
    generate(ours, prompts[:2, :8].tolist(), 4, seed=0)  # warm-up
    with torch.no_grad():
        hf.generate(prompts[:2, :8], attention_mask=torch.ones(2, 8, dtype=torch.long), max_new_tokens=4,
                    do_sample=True, top_k=0)
    c = ours.config
    kv_bytes = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * (a.prompt + a.new) * a.batch
    step_bytes = (ours.num_params() + kv_bytes) * ours.dtype.itemsize
    t_ours, t_hf, first_ours, first_hf, limits = [], [], [], [], []
    for _ in range(a.reps):   # alternated, each side's median: a shared machine drifts by 10-20% between runs
        out, dt = _timed(lambda: generate(ours, prompts.tolist(), a.new, Sampling(1.0), seed=0))
        t_ours.append(dt)
        assert all(len(s.tokens) == a.new for s in out)
        first_ours.append(_timed(lambda: generate(ours, prompts.tolist(), 1, Sampling(1.0), seed=0))[1])
        with torch.no_grad():
            ref, dt = _timed(lambda: hf.generate(prompts, attention_mask=torch.ones_like(prompts),
                                                 max_new_tokens=a.new, min_new_tokens=a.new, do_sample=True,
                                                 temperature=1.0, top_k=0, top_p=1.0))
            t_hf.append(dt)
            assert ref.shape == (a.batch, a.prompt + a.new)
            first_hf.append(_timed(lambda: hf.generate(prompts, attention_mask=torch.ones_like(prompts),
                                                       max_new_tokens=1, do_sample=True, top_k=0))[1])
        limits.append(_cpu_limits(step_bytes, dtype))   # between the sides' runs, as loaded as they were
    bandwidth, peak = _best_limits(limits)
    # a 1-token generate is the prefill and one draw, so a rep's other a.new - 1 steps are the difference
    steps_ours, steps_hf = ([(t - t1) / (a.new - 1) * 1e3 for t, t1 in zip(full, one)]
                            for full, one in ((t_ours, first_ours), (t_hf, first_hf)))
    step_ours, step_hf, best_step = statistics.median(steps_ours), statistics.median(steps_hf), min(steps_ours)
    t_ours, t_hf = statistics.median(t_ours), statistics.median(t_hf)
    first_ours, first_hf = statistics.median(first_ours), statistics.median(first_hf)
    pre_bytes, pre_flops = _prefill_roof_ms(ours, a.batch, a.prompt, bandwidth, peak)
    dec_bytes, dec_flops = _decode_roof_ms(ours, a.batch, a.prompt + a.new / 2, bandwidth, peak)
    pre_roof, dec_roof = max(pre_bytes, pre_flops), max(dec_bytes, dec_flops)
    t_roof = (pre_roof + (a.new - 1) * dec_roof) / 1e3
    n = a.batch * a.new
    print(f"generate  batch {a.batch} x prompt {a.prompt} + {a.new} sampled tokens (prefill included), median of "
          f"{a.reps}; roof = the larger of the bytes read at the measured read bandwidth and the matmul FLOPs at "
          f"the measured {a.dtype} matmul peak (each the best of {a.reps}, measured between the runs)")
    print(f"  limits        read {bandwidth / 1e9:.1f} GB/s (a sum over {step_bytes / 2**20:.0f} MiB, the weights "
          f"and the full cache), matmul 2048^3 {a.dtype} {peak / 1e9:.0f} GFLOP/s")
    print(f"  ours          {n / t_ours:9.1f} tok/s  ({t_ours:.2f} s)   {t_ours / t_roof:5.2f}x its roof "
          f"({n / t_roof:.1f} tok/s, {t_roof:.2f} s)")
    print(f"  transformers  {n / t_hf:9.1f} tok/s  ({t_hf:.2f} s)   {t_hf / t_roof:5.2f}x the roof")
    print(f"  ratio         {t_hf / t_ours:9.2f} x")
    print(f"  prefill ms    ours {first_ours * 1e3:8.1f}, transformers {first_hf * 1e3:8.1f} (a 1-token generate); "
          f"roof {pre_roof:7.1f} (bytes {pre_bytes:.1f}, FLOPs {pre_flops:.1f}): ours "
          f"{first_ours * 1e3 / pre_roof:.2f}x")
    print(f"  decode ms     ours {step_ours:8.2f}, transformers {step_hf:8.2f} a step (a rep's generate - its 1-token "
          f"generate, / {a.new - 1}; the median rep); roof {dec_roof:6.2f} (bytes {dec_bytes:.2f}, FLOPs "
          f"{dec_flops:.2f}, mean context {a.prompt + a.new / 2:g}): ours {step_ours / dec_roof:.2f}x (its fastest "
          f"rep {best_step:.2f} ms, {best_step / dec_roof:.2f}x), transformers {step_hf / dec_roof:.2f}x")
    native = a.dtype == _native_dtype()
    if a.shape == "smollm2" and a.batch == 16:
        if native:
            met = step_ours <= CPU_ROOF_TARGET * dec_roof
            print(f"  target        decode step <= {CPU_ROOF_TARGET:g}x its roof at SmolLM2's shape, batch 16, "
                  f"{a.dtype}: {step_ours / dec_roof:.2f}x, {'MET' if met else 'MISSED'}")
        if a.dtype == "float32" or native:   # bf16's target is set where the CPU computes bf16 natively
            target = CPU_DECODE_TARGETS[a.dtype]
            print(f"  target        >= {target:g}x transformers at SmolLM2's shape, batch 16, {a.dtype}: "
                  f"{t_hf / t_ours:.2f}x, {'MET' if t_hf / t_ours >= target else 'MISSED'}")

    # multi-turn: KV reuse vs re-prefilling the whole history each turn (both with our generate)
    B, T = a.session_batch, a.turns
    obs = torch.randint(0, V, (T, B, a.obs), generator=g).tolist()
    first = torch.randint(0, V, (B, a.session_prompt), generator=g).tolist()
    sess = Session(ours, B, a.session_prompt + T * (a.obs + a.reply) + 1)
    hist = [list(p) for p in first]
    t_reuse, t_full = [], []
    for turn in range(T):
        new = first if turn == 0 else [obs[turn][b] for b in range(B)]
        if turn:
            for b in range(B):
                hist[b] += obs[turn][b]
        r, dt = _timed(lambda: generate(ours, new, a.reply, seed=turn, session=sess, rows=list(range(B))))
        t_reuse.append(dt)
        _, dt = _timed(lambda: generate(ours, hist, a.reply, seed=turn))
        t_full.append(dt)
        for b in range(B):
            hist[b] += r[b].tokens
    k = min(5, T)
    print(f"session  {T} turns x {B} rows, {a.obs} new observation tokens + {a.reply} sampled per turn, "
          f"final history {len(hist[0])} tokens")
    for name, ts in (("KV reuse  ", t_reuse), ("re-prefill", t_full)):
        print(f"  {name}    {sum(ts):7.2f} s total; first {k} turns {sum(ts[:k]) / k * 1e3:6.1f} ms/turn, "
              f"last {k} {sum(ts[-k:]) / k * 1e3:6.1f} ms/turn")
    print(f"  ratio         {sum(t_full) / sum(t_reuse):7.2f} x")

    # constrained replies (the tiny actor's move words in bytes): jump-forward feeds forced bytes in chunks;
    # transformers' prefix_allowed_tokens_fn walks the same trie one sampled token at a time
    from hf import ByteTokenizer
    from small.grammar import Constraint
    moves = ["north", "east", "south", "west", "northeast", "southeast", "southwest", "northwest"]
    eos = V - 1
    c = Constraint([list(ByteTokenizer().encode(m)) + [eos] for m in moves])
    trie = c.trie
    short = prompts[:, :64]  # an actor turn's prompt is short: the reply's decode steps dominate

    def allowed_hf(b, ids):
        node = trie
        for t in ids[short.shape[1]:].tolist():
            node = node.get(t, {})
        return [t for t in node if t >= 0] or [eos]

    out, t_ours = _timed(lambda: generate(ours, short.tolist(), 16, constraint=[c] * a.batch, seed=0))
    with torch.no_grad():
        ref, t_hf = _timed(lambda: hf.generate(short, attention_mask=torch.ones_like(short), max_new_tokens=16,
                                               do_sample=True, top_k=0, eos_token_id=eos, pad_token_id=eos,
                                               prefix_allowed_tokens_fn=allowed_hf))
    n = sum(len(s.tokens) for s in out)
    assert all(ByteTokenizer().decode(s.tokens[:-1]) in moves for s in out)
    print(f"constrained  batch {a.batch} x prompt {short.shape[1]}, reply one of 8 move words ({n / a.batch:.1f} "
          f"tokens each, prefill included)")
    print(f"  ours (jump-forward)               {t_ours:7.3f} s")
    print(f"  transformers (prefix_allowed_fn)  {t_hf:7.3f} s")
    print(f"  ratio                             {t_hf / t_ours:7.2f} x")


def _train_batch(V: int, batch: int, seq: int, device="cpu", seed=0):
    """Right-padded random sequences of seq/2 to seq tokens (pad 0, real tokens 1..V-1) and the mask of the
    scored ones (a first eighth, the "prompt", is not scored); drawn from their own generator seeded with
    `seed`, so every call and every process times the same batch."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, V, (batch, seq), generator=g)
    lengths = torch.randint(seq // 2, seq + 1, (batch,), generator=g)
    mask = torch.arange(seq)[None, :] < lengths[:, None]
    tokens = tokens.masked_fill(~mask, 0)
    mask[:, : seq // 8] = False
    return tokens.to(device), mask.to(device)


def _logprob_step(side: str, model, tokens, mask):
    """One forward + backward of the summed log-probs of the masked tokens: ours through token_logprobs,
    transformers' through the full logits, a log-softmax and a gather."""
    from model import token_logprobs

    def ours_step():
        token_logprobs(model, tokens, mask).sum().backward()

    def hf_step():
        logits = model(tokens).logits.float()
        lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, tokens[:, 1:, None])[..., 0]
        (lp * mask[:, 1:]).sum().backward()
    return ours_step if side == "ours" else hf_step


def _train_one(a):
    """One side of the train benchmark, in its own process (so the peaks don't mix): prints JSON {seconds (the
    fastest of a.steps), median (of the steps after the first), peak_mb, flops}. bfloat16 is the update's: fp32
    masters under autocast."""
    from model import Transformer
    torch.manual_seed(0)
    model = (Transformer.from_pretrained(a.ckpt, dtype=torch.float32) if a.side == "ours"
             else _hf_model(a.ckpt).train())
    tokens, mask = _train_batch(model.config.vocab_size, a.batch, a.seq)
    step = _logprob_step(a.side, model, tokens, mask)
    if a.dtype == "bfloat16":
        fp32_step = step

        def step():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                fp32_step()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = [_timed(step)[1]]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(a.steps - 1):
        model.zero_grad(set_to_none=True)
        times.append(_timed(step)[1])
    flops = _train_flops(model, mask) if a.side == "ours" else None
    print(json.dumps({"seconds": min(times), "median": statistics.median(times[1:] or times),   # past set-up
                      "peak_mb": (peak - base) / 1024, "flops": flops}))


def bench_train(a):
    path = _checkpoint(a.ckpt, a.shape)
    res, limits = {}, []
    for side in ("ours", "hf"):
        cmd = [sys.executable, os.path.abspath(__file__), "_train_one", "--side", side, "--ckpt", path,
               "--batch", str(a.batch), "--seq", str(a.seq), "--threads", str(a.threads), "--dtype", a.dtype,
               "--steps", str(a.steps)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"{side} side failed:\n{out.stderr[-2000:]}")
        res[side] = json.loads(out.stdout.strip().splitlines()[-1])
        limits.append(_cpu_limits(2**28, getattr(torch, a.dtype)))   # after each side, as loaded as it was
    _, peak = _best_limits(limits)
    o, h = res["ours"], res["hf"]
    print(f"train  log-probs forward + backward, batch {a.batch} x {a.seq} tokens, {a.shape} shape ({a.dtype}"
          f"{', fp32 masters under autocast' if a.dtype == 'bfloat16' else ''}, {a.threads} threads; {_cpu_kind()}); "
          f"memory = growth of peak RSS during the first step; time the fastest of {a.steps} steps, MFU at the "
          "median step after the first and at the fastest")
    print(f"  ours (token_logprobs)            {o['seconds']:7.2f} s   peak +{o['peak_mb']:8.1f} MB")
    print(f"  transformers (logits + gather)   {h['seconds']:7.2f} s   peak +{h['peak_mb']:8.1f} MB")
    print(f"  ratio (theirs / ours)            {h['seconds'] / o['seconds']:7.2f} x time, "
          f"{h['peak_mb'] / max(o['peak_mb'], 1e-9):.2f} x memory")
    # MFU against what this CPU's matmul does (the best of 2, one after each side); one model, so one FLOP count
    mfu = {side: (_mfu(o["flops"], r["median"], peak), _mfu(o["flops"], r["seconds"], peak)) for side, r in res.items()}
    print(f"  MFU           model FLOPs {o['flops'] / 1e12:.3g} T a step (`_train_flops`: padding counted, lm_head at "
          f"the scored tokens); matmul 2048^3 {a.dtype} {peak / 1e9:.0f} GFLOP/s; median / best step: ours "
          f"{mfu['ours'][0]:.1f}% / {mfu['ours'][1]:.1f}%, transformers {mfu['hf'][0]:.1f}% / {mfu['hf'][1]:.1f}%")
    if a.shape == "smollm2" and a.dtype == _native_dtype():
        print(f"  target        the update's MFU >= {CPU_TRAIN_MFU_TARGET:g}% of the measured matmul at SmolLM2's "
              f"shape, {a.dtype}, median step: {mfu['ours'][0]:.1f}%, "
              f"{'MET' if mfu['ours'][0] >= CPU_TRAIN_MFU_TARGET else 'MISSED'}")


# ---------------------------------------------------------------------------------------------------------
# bank: search latency against a numpy brute force

def _filled(n, d, rng):
    from bank import ExperienceBank
    keys = rng.standard_normal((n, d)).astype(np.float32)
    keys /= np.linalg.norm(keys, axis=1, keepdims=True)
    bank = ExperienceBank(d, capacity=max(n, 20000))
    kt = torch.from_numpy(keys)
    for i in range(n):
        bank.add("room", f"lesson {i}", kt[i], source=i // 3, step=0)
    return bank, keys


def bench_search(sizes, d=384, nq=32, k=1, reps=100):
    rng = np.random.default_rng(0)
    print(f"search: {nq} queries x {d}-d, top-{k} after the diversity re-rank (fp32, torch threads "
          f"{torch.get_num_threads()})")
    print(f"{'entries':>8} {'bank p50':>9} {'p99':>7} {'numpy p50':>10} {'p99':>7} {'numpy/bank':>11}")
    for n in sizes:
        bank, keys = _filled(n, d, rng)
        q = rng.standard_normal((nq, d)).astype(np.float32)
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        qt = torch.from_numpy(q)
        c = min(n, 16)

        def brute():  # the plain reference: exact scores, top-16 candidates per query, sorted
            s = q @ keys.T
            idx = np.argpartition(-s, c - 1, axis=1)[:, :c]
            return np.take_along_axis(idx, np.argsort(-np.take_along_axis(s, idx, 1), axis=1), 1)
        reps_n = reps if n <= 20000 else reps // 4
        ours = _latency(lambda: bank.search("room", qt, k), reps_n)
        ref = _latency(brute, reps_n)
        print(f"{n:>8} {ours[0]:>7.2f}ms {ours[1]:>5.2f}ms {ref[0]:>8.2f}ms {ref[1]:>5.2f}ms "
              f"{ref[0] / ours[0]:>10.2f}x")


def bench_bank(a):
    bench_search([int(s) for s in a.sizes.split(",")], reps=a.reps)


# ---------------------------------------------------------------------------------------------------------
# env: our text wrappers against the raw gym env they drive

def _rate(reset, step, n_actions, steps, seed=0):
    """Steps per second of random play over `steps` steps, resetting (untimed) whenever an episode ends."""
    rng = random.Random(seed)
    episode = 0
    reset(episode)
    spent = 0.0
    for _ in range(steps):
        action = rng.randrange(n_actions)
        done, dt = _timed(lambda: step(action))
        spent += dt
        if done:
            episode += 1
            reset(episode)
    return steps / spent


def _minihack_rates(task, steps):
    import envs
    ours = envs.make(task, max_steps=10**6)
    raw = envs.make_minihack_raw(task)  # same engine, same observation keys, no text

    def raw_reset(seed):
        envs.seed_minihack(raw, seed)
        raw.reset()

    def raw_step(i):
        _, _, term, trunc, _ = raw.step(ours.action_index[ours.actions[i]])
        return term or trunc

    raw_rate = _rate(raw_reset, raw_step, len(ours.actions), steps)
    our_rate = _rate(ours.reset, lambda i: ours.step(ours.actions[i])[2], len(ours.actions), steps)
    return our_rate, raw_rate


def bench_env(a):
    import envs
    import webshop
    print(f"env stepping, random actions, {a.steps} steps each (steps/s; higher is better)")
    print(f"{'task':10s} {'ours':>10s} {'raw gym':>10s} {'ours/raw':>9s}")
    for task in envs.MINIHACK:
        ours, raw = _minihack_rates(task, a.steps)
        print(f"{task:10s} {ours:10.0f} {raw:10.0f} {ours / raw:9.2f}")
    soko = envs.make("sokoban", max_steps=10**6)
    rate = _rate(soko.reset, lambda i: soko.step(soko.actions[i])[2], 4, a.steps)
    _, gen = _timed(lambda: [soko.reset(10_000 + s) for s in range(50)])
    print(f"{'sokoban':10s} {rate:10.0f} {'-':>10s} {'-':>9s}   (room generation {gen / 50 * 1e3:.1f} ms/reset)")
    shop = envs.make("webshop")
    envs.webshop_search("warm up")  # builds the index (about a second, once per process)
    rate = _rate(shop.reset, lambda i: shop.step(shop.actions[i % len(shop.actions)])[2], 10**6, a.steps)
    queries = [g["instruction_text"].lower() for g in shop.goals[:200]]
    _, search = _timed(lambda: [webshop.search_index().search(webshop.analyze(q), 50) for q in queries])
    print(f"{'webshop':10s} {rate:10.0f} {'-':>10s} {'-':>9s}   (search {search / len(queries) * 1e3:.2f} ms/query)")
    import crl
    workers = a.workers or crl.cores_per_rank()
    print(f"\nan iteration's environment phase: {a.episodes} episodes reset, then {a.phase_steps} random valid steps "
          f"each in lockstep\n(seconds; in the trainer's process vs {workers} worker processes, --env-workers)")
    print(f"{'task':10s} {'serial':>9s} {'workers':>9s} {'speed-up':>9s} {'resets/s':>17s} {'steps/s':>17s}")
    for task in a.phase_tasks.split(","):
        (s_reset, s_step), (w_reset, w_step) = (_env_phase(task, n, a.episodes, a.phase_steps) for n in (0, workers))
        steps = a.episodes * a.phase_steps
        print(f"{task:10s} {s_reset + s_step:9.2f} {w_reset + w_step:9.2f} {(s_reset + s_step) / (w_reset + w_step):8.2f}x"
              f" {a.episodes / s_reset:8.1f}>{a.episodes / w_reset:<8.1f} {steps / s_step:8.0f}>{steps / w_step:<8.0f}")


def _env_phase(task, workers, episodes, steps):
    """Seconds to reset `episodes` games and step them `steps` times with seeded random valid actions, all at
    once as a rollout does (games made beforehand, not timed). An episode that ends is not stepped again."""
    import envs
    pool = envs.EnvPool(workers=workers)
    games = [pool.take(task) for _ in range(episodes)]
    _, reset = _timed(lambda: pool.reset_all(games, list(range(episodes))))
    rng, playing, spent = random.Random(0), games, 0.0
    for _ in range(steps):
        replies = [rng.choice(g.actions) for g in playing]
        results, dt = _timed(lambda: pool.step_all(playing, replies))
        spent += dt
        playing = [g for g, (_, _, done, _) in zip(playing, results) if not done]
    return reset, spent


# ---------------------------------------------------------------------------------------------------------
# kernels: Triton against the torch references (CUDA only: on CPU Triton runs only in its interpreter)

def bench_kernels(a):
    if not torch.cuda.is_available():
        print("bench kernels: skipped, the Triton kernels need a CUDA device (CPU runs use the torch references)")
        return
    from ops.decode_attention import decode_attention_ref, decode_attention_triton
    from ops.logsoftmax import selective_log_softmax_ref, selective_log_softmax_triton
    from ops.rmsnorm import rmsnorm_ref, rmsnorm_triton
    from ops.rope import apply_rope_ref, apply_rope_triton

    def ms(fn, iters=50):  # mean per call; synchronised only around the whole batch of calls
        fn()
        return _timed(lambda: [fn() for _ in range(iters)], cuda=True)[1] / iters * 1e3

    def peak_mib(fn):
        return _timed_peak(fn, "cuda")[1]

    def row(name, ours, ref, unit="ms"):
        print(f"{name:<44} triton {ours:9.3f} {unit}   torch {ref:9.3f} {unit}   ratio (torch/triton) "
              f"{ref / ours:6.2f}x")

    dev, bf = "cuda", torch.bfloat16
    torch.manual_seed(0)
    x, w = torch.randn(16 * 512, 1024, device=dev, dtype=bf), torch.randn(1024, device=dev, dtype=bf)
    row("rmsnorm 8192 x 1024 bf16", ms(lambda: rmsnorm_triton(x, w, 1e-6)), ms(lambda: rmsnorm_ref(x, w, 1e-6)))
    x = torch.randn(16, 512, 3 * 16, 64, device=dev, dtype=bf)[:, :, :16]
    c, s = torch.randn(16, 512, 32, device=dev), torch.randn(16, 512, 32, device=dev)
    row("rope [16, 512, 16, 64] bf16 view", ms(lambda: apply_rope_triton(x, c, s)),
        ms(lambda: apply_rope_ref(x, c, s)))
    kc = torch.randn(32, 8, 2048, 64, device=dev, dtype=bf)
    vc = torch.randn_like(kc)
    q = torch.randn(16, 16, 64, device=dev, dtype=bf)
    rows = torch.randperm(32, device=dev)[:16]
    lengths = torch.randint(1, 2049, (16,), device=dev)
    row("decode attn B16 Hq16 Hkv8 L<=2048 D64 bf16", ms(lambda: decode_attention_triton(q, kc, vc, rows, lengths)),
        ms(lambda: decode_attention_ref(q, kc, vc, rows, lengths)))
    bandwidth = _copy_bandwidth(torch.device(dev), 2**30)
    for n in (2048, 4096, 8192):   # SmolLM2's heads, batch 16, every row full (48 programs): against the roof
        kc, vc = (torch.randn(16, 3, n, 64, device=dev, dtype=bf) for _ in range(2))
        q, rows, lengths = torch.randn(16, 9, 64, device=dev, dtype=bf), torch.arange(16, device=dev), \
            torch.full((16,), n, device=dev)
        roof = 2 * kc.numel() * kc.element_size() / bandwidth * 1e3   # K and V read once at the copy bandwidth
        one = ms(lambda: decode_attention_triton(q, kc, vc, rows, lengths))
        print(f"decode attn B16 Hq9 Hkv3 L={n} D64 bf16: {one:.4f} ms, {one / roof:.1f}x its roof of {roof:.4f} ms")
    logits = torch.randn(4096, 151936, device=dev, dtype=bf, requires_grad=True)
    t = torch.randint(0, 151936, (4096,), device=dev)

    def fwd_bwd(fn):
        return lambda: fn(logits, t).sum().backward()
    row("selective log-softmax 4096 x 151936 fwd+bwd", ms(fwd_bwd(selective_log_softmax_triton), 10),
        ms(fwd_bwd(selective_log_softmax_ref), 10))
    logits.grad = None
    ours = peak_mib(fwd_bwd(selective_log_softmax_triton))
    logits.grad = None
    ref = peak_mib(fwd_bwd(selective_log_softmax_ref))
    row("  peak extra memory", ours, ref, unit="MiB")


# ---------------------------------------------------------------------------------------------------------
# gpu: a Qwen2.5-0.5B-shaped random checkpoint on one GPU in bf16, ours against transformers, and how much of
# the GPU's matmul peak our decoding reaches

QWEN25_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
                  rope_theta=1e6, tie_word_embeddings=True)
GPU_SIZES = dict(batch=32, prompt=128, new=128, train_batch=8, seq=1024, matmul=8192)
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5,
                    rope_theta=1e5, tie_word_embeddings=True)
SMALL = dict(QWEN25_05B, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)  # --small: the same code on a CPU in seconds
SMALL_SIZES = dict(batch=4, prompt=16, new=8, train_batch=2, seq=64, matmul=256)
STEP_SHAPES = {"Qwen2.5-0.5B": ("qwen2", QWEN25_05B), "SmolLM2-135M": ("llama", SMOLLM2_135M)}
STEP_BATCHES = (1, 8, 32, 64)
TARGETS = {"Qwen2.5-0.5B": 3.0, "SmolLM2-135M": 2.0}   # ms a decode step at batch 32
TARGET_ROOF, TARGET_VS_HF, TARGET_MFU = 10.0, 10.0, 40.0


def _random_checkpoint(shape: dict, path: str, arch: str = "qwen2"):
    """transformers' own Qwen2 (or Llama) with its random init, saved in bf16: what both sides load."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    _quiet_transformers()
    torch.manual_seed(0)
    config, model = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[arch]
    model(config(**shape, eos_token_id=None, bos_token_id=None, pad_token_id=0)).to(torch.bfloat16).save_pretrained(path)


def _copy_bandwidth(device, n_bytes: int, reps=20, read: bool = False) -> float:
    """Bytes/s of a device-to-device copy, counting the bytes read and the bytes written: the memory roof. With
    `read`, of a sum over the n_bytes instead (reads only: on a CPU a copy's writes cost more than its reads)."""
    src = torch.randn(n_bytes // 4, device=device)
    dst = torch.empty_like(src)
    work = src.sum if read else lambda: dst.copy_(src)
    work()
    _, dt = _timed(lambda: [work() for _ in range(reps)], torch.device(device).type == "cuda")
    return (1 if read else 2) * n_bytes * reps / dt


def _roof_ms(model, batch: int, context: float, bandwidth: float) -> float:
    """The fewest bytes a decode step moves (every weight once, tied ones once, and each row's K/V cache of
    `context` positions) over the copy bandwidth."""
    c = model.config
    kv = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * context * batch
    return (model.num_params() + kv) * model.dtype.itemsize / bandwidth * 1e3


def _train_flops_parts(model, mask) -> tuple[float, float]:
    """The step's model FLOPs in two parts, (blocks, lm_head): 6 per weight per position through the blocks
    (forward 2, backward 4) with causal attention (q.k and p.v over the positions before each), at every
    position, padding included; and 6 per lm_head weight for the scored tokens only."""
    c = model.config
    B, T = mask.shape
    head = c.vocab_size * c.hidden_size
    body = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)) - head
    attention = 3 * 4 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * (T / 2)
    return B * T * (6 * body + attention), 6 * head * int(mask[:, 1:].sum())


def _train_flops(model, mask) -> float:
    """The whole step's model FLOPs: the blocks and lm_head (`_train_flops_parts`)."""
    return sum(_train_flops_parts(model, mask))


# Dense bf16 tensor-core peaks from NVIDIA's datasheets (the sparsity figures halved), keyed by
# torch.cuda.get_device_name; a name not here has no datasheet figure (None), and only the measured matmul is
# reported against.
DATASHEET_BF16 = {"NVIDIA H200": 989.5e12,               # H200 SXM
                  "NVIDIA H100 80GB HBM3": 989.5e12,     # H100 SXM
                  "NVIDIA H100 PCIe": 756.5e12,
                  "NVIDIA A100-SXM4-80GB": 312e12, "NVIDIA A100-SXM4-40GB": 312e12,
                  "NVIDIA A100 80GB PCIe": 312e12, "NVIDIA A100-PCIE-40GB": 312e12}


def _datasheet_peak(device_name: str) -> float | None:
    return DATASHEET_BF16.get(device_name)


def _mfu(flops: float, seconds: float, peak: float | None) -> float | None:
    """Percent of `peak` (FLOP/s) that `flops` done in `seconds` reach; None without a peak. The FLOPs must be
    those of what took the seconds."""
    return None if peak is None else 100 * flops / seconds / peak


def _real_tokens(tokens, pad=0) -> int:
    """The positions of a right-padded batch that hold a token (not `pad`)."""
    return int((tokens != pad).sum())


def _train_figures(flops: float, seconds: list, positions: int, real: int, peaks: dict) -> dict:
    """A training step timed several times: its median and best (fastest) seconds, positions/s and real
    tokens/s at the median, the padding share, and MFU at the median and at the best step against each peak
    in `peaks` ({name: FLOP/s or None})."""
    times = sorted(seconds)
    median, best = statistics.median(times), times[0]
    out = {"median s": median, "best s": best, "worst s": times[-1], "repeats": len(times),
           "positions/s": positions / median, "real tokens/s": real / median, "padding %": 100 * (1 - real / positions)}
    for name, peak in peaks.items():
        out[f"MFU % {name} median"], out[f"MFU % {name} best"] = _mfu(flops, median, peak), _mfu(flops, best, peak)
    return out


def _matmul_flops(n: int, device, reps=20, dtype=torch.bfloat16) -> float:
    """FLOP/s of an n^3 torch.matmul in `dtype`: the practical peak the decode figure is a share of."""
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    _, dt = _timed(lambda: [a @ b for _ in range(reps)], torch.device(device).type == "cuda")
    return 2 * n ** 3 * reps / dt


def _decode_flops_per_token(model, context: float) -> float:
    """2 FLOPs per weight of every matmul a token goes through (all nn.Linear weights, lm_head included),
    plus attention over `context` cached positions: q.k and p.v, 2 * 2 * heads * head_dim per position and
    layer."""
    c = model.config
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return 2 * weights + 4 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * context


TRAIN_REPEATS, MATMUL_REPEATS = 5, 5


def _gpu_side(run_generate, train_step, a, device) -> tuple[dict, list]:
    """One side's figures: generate (prefill + a.new tokens) time and peak; decode time alone, as generate
    minus a one-token generate of the same prompts; forward + backward peak and positions/s at the median of
    TRAIN_REPEATS steps (after a warm-up); and the seconds of those steps."""
    run_generate(min(2, a.batch), 4)  # warm-up: Triton compiles, allocator pools
    t_gen, mem_gen = _timed_peak(lambda: run_generate(a.batch, a.new), device)
    t_first, _ = _timed_peak(lambda: run_generate(a.batch, 1), device)
    train_step()
    steps = [_timed_peak(train_step, device) for _ in range(TRAIN_REPEATS)]
    seconds = [t for t, _ in steps]
    return {"generate tok/s": a.batch * a.new / t_gen, "generate peak MiB": mem_gen,
            "decode tok/s": a.batch * (a.new - 1) / (t_gen - t_first),
            "train positions/s": a.train_batch * a.seq / statistics.median(seconds),
            "train peak MiB": max(m for _, m in steps)}, seconds


def bench_gpu(a):
    from model import Transformer, generate
    from sampling import Sampling
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench gpu: no CUDA device here; run it on a machine with a GPU, or smoke-test the same "
                         "code on CPU with `python bench.py gpu --device cpu --small`")
    shape, sizes = (SMALL, SMALL_SIZES) if a.small else (QWEN25_05B, GPU_SIZES)
    for k, v in sizes.items():
        setattr(a, k, getattr(a, k) or v)
    V = shape["vocab_size"]
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(1, V, (a.batch, a.prompt), generator=g)
    tokens, mask = _train_batch(V, a.train_batch, a.seq, device)
    with tempfile.TemporaryDirectory() as path:
        _random_checkpoint(shape, path)
        moved = {m: _lr_1e6_steps(path, device, tokens[:2], mask[:2], m) for m in (torch.float32, torch.bfloat16)}
        ours = Transformer.from_pretrained(path, dtype=torch.bfloat16, device=device)
        hf = _hf_model(path, torch.bfloat16).to(device)

    def ours_generate(b, n):
        out = generate(ours, prompts[:b].tolist(), n, Sampling(1.0), seed=0)
        assert all(len(s.tokens) == n for s in out)

    def hf_generate(b, n):
        torch.manual_seed(0)
        x = prompts[:b].to(device)
        with torch.no_grad():
            out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                              do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0)
        assert out.shape == (b, a.prompt + n)

    def train_step(side, model):
        step = _logprob_step(side, model, tokens, mask)

        def from_no_grads():  # every timed step allocates its gradients alike
            model.zero_grad(set_to_none=True)
            step()
        return from_no_grads

    res, train_s = {}, {}
    for side, gen, model, kind in (("ours", ours_generate, ours, "ours"), ("transformers", hf_generate, hf, "hf")):
        res[side], train_s[side] = _gpu_side(gen, train_step(kind, model), a, device)
    matmuls = sorted(_matmul_flops(a.matmul, device) for _ in range(MATMUL_REPEATS))
    peak = statistics.median(matmuls)
    per_token, train_flops = _decode_flops_per_token(ours, a.prompt + a.new / 2), _train_flops(ours, mask)
    for r in res.values():
        r["decode TFLOP/s"] = r["decode tok/s"] * per_token / 1e12
        r["decode share of peak %"] = 100 * r["decode tok/s"] * per_token / peak
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peaks = {"datasheet": _datasheet_peak(name), "matmul": peak}
    train = {side: _train_figures(train_flops, s, tokens.numel(), _real_tokens(tokens), peaks)
             for side, s in train_s.items()}
    _print_gpu_table(a, ours, device, res, peak, per_token, hf)
    _print_train_mfu(a, name, train, train_flops, peaks, matmuls)
    (f32_frac, f32_mean), (bf16_frac, bf16_mean) = moved[torch.float32], moved[torch.bfloat16]
    print(f"  AdamW lr 1e-6, {LR_STEPS} steps, bf16 compute: weights moved {100 * f32_frac:.1f}% with fp32 masters, "
          f"{100 * bf16_frac:.1f}% with bf16 masters; mean |step| bf16 / fp32 masters = {bf16_mean / f32_mean:.3f}")
    del ours, hf
    steps = _decode_steps(a, device)
    _print_decode_steps(a, steps, train["ours"]["MFU % matmul median"])


def _step_ms(run, n: int, cuda: bool, tries=2) -> float:
    """Milliseconds a decode step: run(k) generates k tokens a row; (run(n) - run(2)) / (n - 2), each the
    fastest of `tries`, so the prefill, the first token and a graph's capture (all in run(2)) cancel."""
    run(2)
    long = min(_timed(lambda: run(n), cuda)[1] for _ in range(tries))
    short = min(_timed(lambda: run(2), cuda)[1] for _ in range(tries))
    return (long - short) / (n - 2) * 1e3


def _decode_steps(a, device) -> dict:
    """{(shape, batch): ms a step of ours with decode graphs, ours eager, transformers, and the memory roof}:
    random bf16 checkpoints, a.prompt-token prompts, sampling at temperature 1, every row the full length."""
    from model import Session, Transformer, generate
    from sampling import Sampling
    cuda = device.type == "cuda"
    bandwidth = _copy_bandwidth(device, 2**30 if cuda else 2**24)
    shapes, batches = ({"small": ("qwen2", SMALL)}, (1, 4)) if a.small else (STEP_SHAPES, STEP_BATCHES)
    out = {"bandwidth": bandwidth}
    for name, (arch, shape) in shapes.items():
        with tempfile.TemporaryDirectory() as path:
            _random_checkpoint(shape, path, arch)
            ours = Transformer.from_pretrained(path, dtype=torch.bfloat16, device=device)
            hf = _hf_model(path, torch.bfloat16).to(device)
        for b in batches:
            prompts = torch.randint(1, shape["vocab_size"], (b, a.prompt), generator=torch.Generator().manual_seed(b))

            def ours_run(k, graphs):
                session = Session(ours, b, a.prompt + k, graphs=graphs)
                generate(ours, prompts.tolist(), k, Sampling(1.0), seed=0, session=session, rows=list(range(b)))

            def hf_run(k):
                x = prompts.to(device)
                with torch.no_grad():
                    hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=k, min_new_tokens=k,
                                do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0)
            out[name, b] = {"roof": _roof_ms(ours, b, a.prompt + 16, bandwidth),
                            "graphs": _step_ms(lambda k: ours_run(k, True), 66, cuda) if cuda else float("nan"),
                            "eager": _step_ms(lambda k: ours_run(k, False), 34, cuda),
                            "transformers": _step_ms(hf_run, 34, cuda)}
        del ours, hf
    return out


def _print_decode_steps(a, steps: dict, mfu: float):
    print(f"decode step, ms (prompt {a.prompt}, bf16, sampling at temperature 1; from the time of 66 or 34 tokens "
          f"minus that of 2); roof = every weight and the mean K/V cache read once at the measured copy "
          f"bandwidth, {steps['bandwidth'] / 1e12:.3g} TB/s")
    print("  graphs, eager: ours (model.generate through a Session, with and without decode graphs); hf eager: "
          "transformers' default generate (eager, DynamicCache, no static cache or torch.compile); each cell the "
          "fastest of 2 tries in one call, not repeated")
    print(f"  {'shape':14s} {'batch':>5s} {'roof':>7s} {'graphs':>8s} {'x roof':>7s} {'eager':>8s} "
          f"{'hf eager':>12s} {'graphs vs hf eager':>19s} {'eager vs hf eager':>18s}")
    for key, r in steps.items():
        if key == "bandwidth":
            continue
        (name, b), g = key, r["graphs"]
        graphs = f"{g:8.3f} {g / r['roof']:6.1f}x" if g == g else f"{'-':>8s} {'-':>7s}"   # nan: no CUDA
        print(f"  {name:14s} {b:5d} {r['roof']:7.3f} {graphs} {r['eager']:8.3f} {r['transformers']:12.3f} "
              + (f"{r['transformers'] / g:18.1f}x" if g == g else f"{'-':>19s}")
              + f" {r['transformers'] / r['eager']:17.2f}x" + ("" if g == g else "   (graphs: CUDA only)"))
    if a.small:
        return
    for name, target in TARGETS.items():
        r = steps[name, 32]
        met = r["graphs"] <= target and (name != "Qwen2.5-0.5B" or (r["graphs"] <= TARGET_ROOF * r["roof"] and
                                                                     r["transformers"] >= TARGET_VS_HF * r["graphs"]))
        print(f"  target {name} batch 32: <= {target} ms" + (f", <= {TARGET_ROOF:g}x roof, >= {TARGET_VS_HF:g}x "
              "transformers' eager step" if name == "Qwen2.5-0.5B" else "") + f": {'met' if met else 'MISSED'}")
    print(f"  target training MFU >= {TARGET_MFU:g}% (median step, of the measured matmul): {mfu:.1f}%, "
          f"{'met' if mfu >= TARGET_MFU else 'MISSED'}")


LR_STEPS = 10


def _lr_1e6_steps(path, device, tokens, mask, master: torch.dtype) -> tuple[float, float]:
    """The fraction of weights that LR_STEPS AdamW steps at the authors' lr 1e-6 move, and their mean |change|,
    with masters in `master` and compute in bf16 (steps below half a bf16 ulp vanish on bf16 masters)."""
    import parallel
    from model import Transformer, token_logprobs
    model = parallel.prepare(Transformer.from_pretrained(path, dtype=master, device=device), device, torch.bfloat16)
    start = [p.detach().float().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    for _ in range(LR_STEPS):
        opt.zero_grad(set_to_none=True)
        with parallel.autocast(model):
            token_logprobs(model, tokens, mask).sum().backward()
        opt.step()
    delta = torch.cat([(p.detach().float() - s).flatten() for p, s in zip(model.parameters(), start)])
    return (delta != 0).float().mean().item(), delta.abs().mean().item()


def _hf_path(hf) -> str:
    """Which transformers path was measured: its default eager generate and forward, and its attention."""
    attn = getattr(hf.config, "_attn_implementation", None) or "default"
    return f"transformers' default path: eager, DynamicCache, attention {attn}, no static cache or torch.compile"


def _print_gpu_table(a, ours, device, res, peak, per_token, hf):
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"gpu  {name}: {'small' if a.small else 'Qwen2.5-0.5B'}-shaped random Qwen2, "
          f"{ours.num_params() / 1e6:.1f}M params, bf16, both sides on the same weights")
    print(f"  transformers = {_hf_path(hf)}; ours = model.generate, decode graphs on CUDA")
    print(f"  generate: batch {a.batch} x prompt {a.prompt} + {a.new} sampled tokens (temperature 1, every row the "
          f"full length); decode = generate minus a 1-token generate (prefill); one-shot runs (ours pays a fresh "
          f"graph capture in each): the decode step table below is the steady-state figure")
    print(f"  train: token_logprobs vs transformers' logits + log-softmax + gather, fwd + bwd, batch "
          f"{a.train_batch} x {a.seq} (seeded; padding counted as positions), the median of {TRAIN_REPEATS} steps")
    print("  peak MiB: torch.cuda.max_memory_allocated during the call above what was allocated before it (the "
          "weights; gradients are included in train)")
    print(f"  matmul peak: {a.matmul}^3 bf16 torch.matmul {peak / 1e12:.4g} TFLOP/s; decode FLOPs/token = 2 x "
          f"matmul weights + 4 x layers x heads x head_dim x mean context = {per_token / 1e9:.4g} GFLOP")
    print(f"  {'':24s} {'ours':>12s} {'transformers':>13s} {'ours better by':>15s}")
    for key in res["ours"]:
        o, h = res["ours"][key], res["transformers"][key]
        if math.isnan(o):
            print(f"  {key:24s} {'-':>12s} {'-':>13s} {'-':>15s}   (CUDA only)")
            continue
        better = h / o if "MiB" in key else o / h  # memory: less is better
        print(f"  {key:24s} {o:12.4g} {h:13.4g} {better:14.2f}x")


def _print_train_mfu(a, name, train, flops, peaks, matmuls):
    """The training step's MFU: the median step first, then the best, against the datasheet's dense bf16 peak
    (when the device is in DATASHEET_BF16) and against the measured matmul; the spread of the repeats."""
    sheet = peaks["datasheet"]
    print(f"  train MFU: model FLOPs {flops / 1e12:.4g} T a step (blocks and attention at all {a.train_batch * a.seq}"
          f" positions, lm_head at the scored tokens); peaks: datasheet dense bf16 "
          + (f"{sheet / 1e12:.4g} TFLOP/s ({name})" if sheet else f"unknown for {name}")
          + f", measured {a.matmul}^3 bf16 matmul {peaks['matmul'] / 1e12:.4g} TFLOP/s (median of {len(matmuls)}, "
          f"{matmuls[0] / 1e12:.4g}-{matmuls[-1] / 1e12:.4g})")
    pct = lambda v: "-" if v is None else f"{v:.1f}%"   # noqa: E731
    for side, r in train.items():
        print(f"  {side:12s} step median {r['median s'] * 1e3:.2f} ms (best {r['best s'] * 1e3:.2f}, worst "
              f"{r['worst s'] * 1e3:.2f}, {r['repeats']} steps): {r['positions/s']:.4g} positions/s, "
              f"{r['real tokens/s']:.4g} real tokens/s (padding {r['padding %']:.1f}% of positions); "
              "MFU median / best: "
              f"{pct(r['MFU % datasheet median'])} / {pct(r['MFU % datasheet best'])} of the datasheet, "
              f"{pct(r['MFU % matmul median'])} / {pct(r['MFU % matmul best'])} of the matmul")

# ---------------------------------------------------------------------------------------------------------
# step: one training iteration with the extractor and bank (crl) against the actor alone (grpo)

STEP_PARTS = ("generate", "env", "update", "extractor", "extractor_update", "merge")


def bench_step(a):
    """Builds each variant's run exactly as train.py does (same flags, seeds and groups), then times
    crl.train_step. The actor's warm-up is 0 by default, so every variant updates the actor every timed
    iteration; the merge pass (every --merge-every iterations) only falls in runs of that many iterations."""
    import crl
    import train
    argv = ["--tasks", a.tasks, "--groups", str(a.groups), "--group-size", str(a.group_size),
            "--seed", str(a.seed), "--warmup", str(a.warmup), *shlex.split(a.extra)]
    device = train.setup_distributed(train.parse_args([*argv, *(["--device", a.device] if a.device else [])]))
    variants = {"crl": ["--mode", "crl"], "grpo": ["--mode", "grpo"]}
    if a.compare == "distill":
        variants = {"inline": ["--distill", "inline"], "background": ["--distill", "background"]}
    if a.compare == "memo":      # the embedder: each text embedded once, or every time it is asked for
        variants = {"recomputed": ["--mode", "crl"], "memo": ["--mode", "crl"]}
    if a.compare == "dtype":     # the number format of forward, backward and rollouts (master weights stay fp32)
        variants = {"float32": ["--dtype", "float32"], "bfloat16": ["--dtype", "bfloat16"]}
    res = {}
    for mode, flags in variants.items():
        args = train.parse_args([*argv, *flags])
        dtype = train.model_dtype(args, device)
        run, _ = train.build(args, device, dtype)
        if run.manager is not None and mode == "recomputed":
            run.manager.embedder.memo_size = 0
        rows = []
        for step in range(a.skip + a.iters):   # the first iterations pay for allocations and kernel set-up
            metrics, dt = _timed(lambda: crl.train_step(run, step))
            if step >= a.skip:
                rows.append({"iteration": dt, **{p: metrics[f"time/{p}"] for p in STEP_PARTS}, "turns": metrics["turns"]})
        if run.manager is not None:
            run.manager.close()
        res[mode] = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
        res[mode]["bank size"] = metrics["bank_size"]
    if crl.rank() > 0:
        return
    print(f"train_step, {args.actor} actor and extractor ({device}{', ' + _cpu_kind() if device.type == 'cpu' else ''}, "
          f"{torch.get_num_threads()} threads, {crl.world()} rank(s)), tasks {a.tasks}, {a.groups} groups x "
          f"{a.group_size}, actor warm-up {a.warmup}: seconds per iteration, mean of {a.iters} after {a.skip} untimed"
          f"\n(with background distillation the extractor's parts overlap "
          f"the actor update; episode length, in mean turns, differs between modes)")
    cols = ("iteration", *STEP_PARTS, "turns")
    w = {c: max(len(c), 7) + 2 for c in cols}
    new, ref = {"mode": ("crl", "grpo"), "distill": ("background", "inline"),
                "memo": ("memo", "recomputed"), "dtype": ("bfloat16", "float32")}[a.compare]
    lw = len(new + "/" + ref)
    print(f"  {'':{lw}s}" + "".join(f"{c:>{w[c]}s}" for c in cols) + "  bank size")
    for mode in variants:
        print(f"  {mode:{lw}s}" + "".join(f"{res[mode][c]:{w[c]}.3f}" for c in cols) + f"  {res[mode]['bank size']:9d}")
    ratio = {c: "-" if res[ref][c] == 0 else f"{res[new][c] / res[ref][c]:.2f}x" for c in cols}
    print(f"  {new + '/' + ref:{lw}s}" + "".join(f"{ratio[c]:>{w[c]}s}" for c in cols))


# ---------------------------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", metavar="{generate,train,bank,env,kernels,gpu,step}")

    def model_parser(name, help, train_one=False):
        s = sub.add_parser(name, help=help) if help else sub.add_parser(name)
        s.add_argument("--ckpt", help="benchmark checkpoint directory (written on first use; default: one per "
                                      "shape in the temp directory)")
        s.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
        s.add_argument("--batch", type=int, default=16)
        if name != "generate":
            s.add_argument("--seq", type=int, default=512, help="sequence length")
            s.add_argument("--shape", choices=["qwen3-25m", "smollm2"], default="qwen3-25m",
                           help="the random checkpoint: a ~25M Qwen3, or SmolLM2-135M's shape (the preset's actor)")
            s.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                           help="compute: fp32, or bf16 under autocast on fp32 masters (the update's)")
            s.add_argument("--steps", type=int, default=2, help="timed steps per side (the first also measures memory)")
        if train_one:
            s.add_argument("--side", choices=["ours", "hf"], default="ours")
        return s

    g = model_parser("generate", "model.generate vs transformers' generate; multi-turn KV reuse vs re-prefill")
    g.add_argument("--shape", choices=["qwen3-25m", "smollm2"], default="qwen3-25m",
                   help="the random checkpoint: a ~25M Qwen3, or SmolLM2-135M's shape (the preset's actor)")
    g.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="weights and compute, both sides")
    g.add_argument("--reps", type=int, default=3, help="generate runs per side, alternated (the median is shown)")
    g.add_argument("--prompt", type=int, default=256, help="prompt tokens")
    g.add_argument("--new", type=int, default=128, help="sampled tokens")
    g.add_argument("--turns", type=int, default=30, help="session turns")
    g.add_argument("--session-batch", type=int, default=4)
    g.add_argument("--session-prompt", type=int, default=64)
    g.add_argument("--obs", type=int, default=16, help="observation tokens appended per turn")
    g.add_argument("--reply", type=int, default=8, help="tokens sampled per turn")
    model_parser("train", "token_logprobs fwd+bwd vs transformers' logits + gather: time and peak memory")
    model_parser("_train_one", None, train_one=True)  # hidden: one side of `train`, in a fresh process

    b = sub.add_parser("bank", help="bank search vs numpy brute force")
    b.add_argument("--sizes", default="1000,20000,100000", help="comma-separated bank sizes")
    b.add_argument("--reps", type=int, default=100, help="timed searches per size (a quarter above 20k)")
    b.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: leave as is)")

    e = sub.add_parser("env", help="text env steps/s vs the raw MiniHack env; Sokoban steps/s; an iteration's "
                                   "environment phase in worker processes vs serial")
    e.add_argument("--steps", type=int, default=2000, help="random-action steps per env")
    e.add_argument("--phase-tasks", default="alfworld,room", help="tasks of the environment-phase comparison")
    e.add_argument("--episodes", type=int, default=64, help="episodes of the environment phase")
    e.add_argument("--phase-steps", type=int, default=10, help="steps of each episode in the environment phase")
    e.add_argument("--workers", type=int, default=0, help="worker processes (0: one per core, as --env-workers)")

    sub.add_parser("kernels", help="Triton kernels vs torch references (CUDA only)")

    gp = sub.add_parser("gpu", help="0.5B-shaped bf16 model on one GPU: generate, train, memory, share of peak")
    gp.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --small, a smoke test)")
    gp.add_argument("--small", action="store_true", help="a tiny shape and sizes, so the same code runs on CPU")
    gp.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: leave as is)")
    for k, v in GPU_SIZES.items():
        gp.add_argument(f"--{k.replace('_', '-')}", type=int, default=0,
                        help=f"default {v} ({SMALL_SIZES[k]} with --small)")

    s = sub.add_parser("step", help="seconds per crl.train_step, mode crl vs mode grpo (tiny preset), "
                                    "distillation inline vs in the background, the embedder with and "
                                    "without its memo, or fp32 vs bf16 compute")
    s.add_argument("--compare", choices=["mode", "distill", "memo", "dtype"], default="mode",
                   help="mode: crl vs grpo; distill: mode crl with --distill inline vs background; memo: mode "
                        "crl, the embedder's memo of texts on vs off; dtype: --dtype float32 vs bfloat16")
    s.add_argument("--tasks", default="room")
    s.add_argument("--groups", type=int, default=2)
    s.add_argument("--group-size", type=int, default=8)
    s.add_argument("--iters", type=int, default=2, help="timed iterations per mode")
    s.add_argument("--skip", type=int, default=1, help="untimed iterations first (allocations, kernel set-up)")
    s.add_argument("--warmup", type=int, default=0, help="actor warm-up iterations (train.py's --warmup)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    s.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: leave as is)")
    s.add_argument("--extra", default="", help="further train.py flags, e.g. \"--history 0 --actor CKPT_DIR\"")
    args = p.parse_args(argv)
    if args.what is None:
        p.print_help()
        p.exit(2)
    if args.what == "step" and args.iters < 1:
        p.error("step: --iters must be >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    if getattr(args, "threads", 0):
        torch.set_num_threads(args.threads)
    {"generate": bench_generate, "train": bench_train, "_train_one": _train_one, "bank": bench_bank,
     "env": bench_env, "kernels": bench_kernels, "gpu": bench_gpu, "step": bench_step}[args.what](args)


if __name__ == "__main__":
    main(sys.argv[1:])
