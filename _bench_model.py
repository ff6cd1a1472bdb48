"""Benchmarks of model.py against transformers on the same checkpoint (merged into bench.py by the lead).

  python _bench_model.py generate [--batch 16 --prompt 256 --new 128 --turns 30 ...]
  python _bench_model.py train    [--batch 16 --seq 512]

generate: tokens/s of our `generate` vs transformers' `generate` (same random ~25M-param Qwen3 checkpoint,
sampling at temperature 1 with no top-k/top-p on both sides, every row forced to the full length), and a
multi-turn session: each turn appends an observation and samples a reply, with the KV cache kept across
turns (Session) vs re-prefilling the whole history every turn.
train: `token_logprobs` forward + backward vs transformers' forward + log-softmax gather + backward on a
batch of right-padded sequences. Time, and peak memory measured as the growth of the process's peak RSS
(ru_maxrss) over its value before the step, each side in a fresh subprocess so the peaks don't mix.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import torch

from model import Session, Transformer, generate, token_logprobs

BENCH_CONFIG = dict(architectures=["Qwen3ForCausalLM"], vocab_size=32000, hidden_size=384, intermediate_size=1024,
                    num_hidden_layers=8, num_attention_heads=6, num_key_value_heads=2, head_dim=64,
                    max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True,
                    eos_token_id=None, bos_token_id=None, pad_token_id=0)


def _checkpoint(path: str) -> str:
    if not os.path.exists(os.path.join(path, "config.json")):
        Transformer.tiny(seed=0, **BENCH_CONFIG).save_pretrained(path)
    return path


def _hf_model(path):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def bench_generate(a):
    path = _checkpoint(a.ckpt)
    ours, hf = Transformer.from_pretrained(path), _hf_model(path)
    V = ours.config.vocab_size
    print(f"checkpoint: Qwen3 {ours.num_params() / 1e6:.1f}M params, vocab {V}; torch threads "
          f"{torch.get_num_threads()}")
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, V, (a.batch, a.prompt), generator=g)
    generate(ours, prompts[:2, :8].tolist(), 4, seed=0)  # warm-up
    with torch.no_grad():
        hf.generate(prompts[:2, :8], attention_mask=torch.ones(2, 8, dtype=torch.long), max_new_tokens=4,
                    do_sample=True, top_k=0)
    out, t_ours = _timed(lambda: generate(ours, prompts.tolist(), a.new, temperature=1.0, seed=0))
    assert all(len(s.tokens) == a.new for s in out)
    with torch.no_grad():
        ref, t_hf = _timed(lambda: hf.generate(prompts, attention_mask=torch.ones_like(prompts),
                                               max_new_tokens=a.new, min_new_tokens=a.new, do_sample=True,
                                               temperature=1.0, top_k=0, top_p=1.0))
    assert ref.shape == (a.batch, a.prompt + a.new)
    n = a.batch * a.new
    print(f"generate  batch {a.batch} x prompt {a.prompt} + {a.new} sampled tokens (prefill included)")
    print(f"  ours          {n / t_ours:9.1f} tok/s  ({t_ours:.2f} s)")
    print(f"  transformers  {n / t_hf:9.1f} tok/s  ({t_hf:.2f} s)")
    print(f"  ratio         {t_hf / t_ours:9.2f} x")

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
        f, dt = _timed(lambda: generate(ours, hist, a.reply, seed=turn))
        t_full.append(dt)
        for b in range(B):
            hist[b] += r[b].tokens
    k = min(5, T)
    print(f"session  {T} turns x {B} rows, {a.obs} new observation tokens + {a.reply} sampled per turn, "
          f"final history {len(hist[0])} tokens")
    print(f"  KV reuse      {sum(t_reuse):7.2f} s total; first {k} turns {sum(t_reuse[:k]) / k * 1e3:6.1f} ms/turn, "
          f"last {k} {sum(t_reuse[-k:]) / k * 1e3:6.1f} ms/turn")
    print(f"  re-prefill    {sum(t_full):7.2f} s total; first {k} turns {sum(t_full[:k]) / k * 1e3:6.1f} ms/turn, "
          f"last {k} {sum(t_full[-k:]) / k * 1e3:6.1f} ms/turn")
    print(f"  ratio         {sum(t_full) / sum(t_reuse):7.2f} x")


def _train_one(a):
    """One side of the train benchmark, in its own process: prints JSON {seconds, peak_mb}."""
    path = a.ckpt
    torch.manual_seed(0)
    model = Transformer.from_pretrained(path) if a.side == "ours" else _hf_model(path).train()
    V = model.config.vocab_size
    tokens = torch.randint(1, V, (a.batch, a.seq))
    lengths = torch.randint(a.seq // 2, a.seq + 1, (a.batch,))
    mask = torch.arange(a.seq)[None, :] < lengths[:, None]
    tokens = tokens.masked_fill(~mask, 0)
    mask[:, : a.seq // 8] = False  # a "prompt" part that is not scored

    def ours_step():
        lp = token_logprobs(model, tokens, mask)
        lp.sum().backward()

    def hf_step():
        logits = model(tokens).logits.float()
        lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, tokens[:, 1:, None])[..., 0]
        (lp * mask[:, 1:]).sum().backward()

    step = ours_step if a.side == "ours" else hf_step
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _, dt = _timed(step)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    model.zero_grad(set_to_none=True)
    _, dt2 = _timed(step)
    print(json.dumps({"seconds": min(dt, dt2), "peak_mb": (peak - base) / 1024}))


def bench_train(a):
    path = _checkpoint(a.ckpt)
    res = {}
    for side in ("ours", "hf"):
        cmd = [sys.executable, os.path.abspath(__file__), "_train_one", "--side", side, "--ckpt", path,
               "--batch", str(a.batch), "--seq", str(a.seq), "--threads", str(a.threads)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"{side} side failed:\n{out.stderr[-2000:]}")
        res[side] = json.loads(out.stdout.strip().splitlines()[-1])
    o, h = res["ours"], res["hf"]
    print(f"train  log-probs forward + backward, batch {a.batch} x {a.seq} tokens (fp32, "
          f"{a.threads} threads); memory = growth of peak RSS during the step")
    print(f"  ours (token_logprobs)            {o['seconds']:7.2f} s   peak +{o['peak_mb']:8.1f} MB")
    print(f"  transformers (logits + gather)   {h['seconds']:7.2f} s   peak +{h['peak_mb']:8.1f} MB")
    print(f"  ratio (theirs / ours)            {h['seconds'] / o['seconds']:7.2f} x time, "
          f"{h['peak_mb'] / max(o['peak_mb'], 1e-9):.2f} x memory")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["generate", "train", "_train_one"])
    p.add_argument("--ckpt", default=os.path.join(tempfile.gettempdir(), "crl_bench_qwen3_25m"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--turns", type=int, default=30)
    p.add_argument("--session-batch", type=int, default=4)
    p.add_argument("--session-prompt", type=int, default=64)
    p.add_argument("--obs", type=int, default=16)
    p.add_argument("--reply", type=int, default=8)
    p.add_argument("--side", choices=["ours", "hf"], default="ours")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    {"generate": bench_generate, "train": bench_train, "_train_one": _train_one}[a.what](a)


if __name__ == "__main__":
    main(sys.argv[1:])
