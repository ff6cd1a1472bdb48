"""model.py — the decoder and the rollout engine.

It opens with the decoder: one hand-written `Transformer` serves Qwen3 (q/k RMSNorm), Qwen2/Qwen2.5 (q/k/v bias)
and Llama (llama3 rope scaling), chosen from a Hugging Face checkpoint's config.json. The formats live below it
in hf.py (config.json, safetensors read and write, the packaged GGUF conversion, the tokenizers), which
`Transformer.from_pretrained` / `save_pretrained` call; the names callers import from here (`ModelConfig`,
`load_tokenizer`, `ByteTokenizer`, `checkpoint_dir`, `PACKAGED`) are hf's, re-exported.
Around the decoder:
  - `Session` + `generate`: batched sampling over a KV cache written in place. A Session keeps live multi-turn
    conversations (one cache row each) so every turn prefills only its new tokens; on CUDA its decode steps
    replay captured graphs (cudagraphs.py).
  - constraints (small/grammar.py): a row's reply may be masked to allowed completions; the ids each step
    allowed are recorded here, and tokens a constraint forces are appended without a sampling step.
  - `token_logprobs`: the training-side recomputation of the sampler's log-probs (same temperature, top-k,
    top-p and constraint masks), chunked over the vocabulary projection. What both mean by "the distribution
    sampled from" is defined once, in sampling.py.
The hot ops (RMSNorm, rotary embedding, decode attention, selective log-softmax) come from ops/, which
runs Triton on CUDA (where Triton is installed) and plain torch elsewhere. crl.py (rollouts, losses) and
embedder.py (the decoder embedder) are the callers.
"""
import math
import os
import platform
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from cudagraphs import DecodeGraphs, default_on
from hf import ModelConfig, checkpoint_dir, hf_parts, read_config, read_weights, write_checkpoint
from hf import PACKAGED, ByteTokenizer, load_tokenizer  # noqa: F401  (re-exported: callers import them from here)
from ops import apply_rope, decode_attention, rmsnorm
from ops.decode_attention import ReadSpan
from sampling import Sampling, Stops, allow_mask, allowed_by_target, draw, target_logprobs

# -----------------------------------------------------------------------------------------------------------
# the decoder

# the dtypes Linear lays out for oneDNN: measured on x86 CPUs only, so used there only; bf16 where oneDNN has it
_PACKED_DTYPES = ((torch.float32,) + ((torch.bfloat16,) if torch.ops.mkldnn._is_mkldnn_bf16_supported() else ())
                  if platform.machine().lower() in ("x86_64", "amd64") and torch.backends.mkldnn.is_available()
                  and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") else ())


def rope_inv_freq(c: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] in fp32, with linear or llama3 (Llama 3.1) scaling applied."""
    D = c.head_dim
    inv = 1.0 / (c.rope_theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    s = c.rope_scaling or {}
    if s.get("rope_type") == "linear":
        inv = inv / s["factor"]
    elif s.get("rope_type") == "llama3":
        # long wavelengths are stretched by `factor`, short ones kept, the band between interpolated smoothly
        factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old = s.get("original_max_position_embeddings", c.max_position_embeddings)
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        mid = (wavelen >= old / hi) & (wavelen <= old / lo)
        inv = torch.where(mid, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    return inv


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return rmsnorm(x, self.weight, self.eps)


@dataclass
class _CacheStep:
    """Where one cached forward call reads and writes the KV cache; built once per call, read by every layer.
    Prefill: `ids` [B, T] right-padded new tokens, row b has n[b] of them, written after start[b] cached ones.
    Decode: T == 1 and every row has exactly one new token (a cheaper attention path)."""
    k: torch.Tensor          # [layers, Bmax, Hkv, L, D] the session's cache
    v: torch.Tensor
    rows: torch.Tensor       # [B] cache row of each batch row
    positions: torch.Tensor  # [B, T] absolute position of each new token
    decode: bool
    write_b: torch.Tensor = None   # prefill: batch index / time index / cache row / position of each real token
    write_t: torch.Tensor = None
    write_row: torch.Tensor = None
    write_pos: torch.Tensor = None
    mask: torch.Tensor = None      # prefill: [B, 1, T, Lmax] which cached keys each new token sees; None when
                                   # every row starts empty (causal over the new tokens)
    lengths: torch.Tensor = None   # decode: [B] cache length including the new token
    span: ReadSpan = None          # decode: what the torch attention paths read, worked out once for all layers

    @classmethod
    def for_prefill(cls, session, rows: torch.Tensor, n: torch.Tensor, T: int) -> "_CacheStep":
        """rows[b] gets n[b] new tokens (right-padded to T) after the session's cached ones."""
        start = session.lengths[rows]
        steps = torch.arange(T, device=rows.device)
        positions = start[:, None] + steps
        wb, wt = (steps[None, :] < n[:, None]).nonzero(as_tuple=True)
        mask = None     # every row starts empty: causal attention over the new tokens needs no mask
        if bool(start.any()):
            end = start + n
            key = torch.arange(int(end.max()), device=rows.device)
            mask = (key[None, None, :] <= positions[:, :, None]) & (key[None, None, :] < end[:, None, None])
            mask = mask[:, None]
        return cls(session.k, session.v, rows, positions, decode=False, write_b=wb, write_t=wt,
                   write_row=rows[wb], write_pos=positions[wb, wt], mask=mask)

    @classmethod
    def for_decode(cls, session, rows: torch.Tensor) -> "_CacheStep":
        """One new token for each of `rows`, after the session's cached ones."""
        pos = session.lengths[rows]
        return cls(session.k, session.v, rows, pos[:, None], decode=True, lengths=pos + 1,
                   span=ReadSpan(rows, pos + 1))


class Linear(nn.Linear):
    """nn.Linear that, in an fp32 or bf16 forward on a CPU outside autograd and autocast (decoding, scoring),
    multiplies by a copy of its weight laid out once for oneDNN (a second copy of the weights in memory), made again
    when the weight changes (its version counter moves on every in-place update): SmolLM2's generate 1.77x as fast
    in fp32, 1.19x in bf16, bit-equal in bf16 (results/cpu-speed/packed-2026-11-28.txt, packed-bf16-2026-11-30.txt)."""

    def forward(self, x):
        w = self.weight
        if not (x.dtype == w.dtype and x.dtype in _PACKED_DTYPES and x.device.type == "cpu"
                and not torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")):
            return super().forward(x)
        key = (w.data_ptr(), w._version)
        if getattr(self, "_packed", (None,))[0] != key:
            self._packed = key, torch.ops.mkldnn._reorder_linear_weight(w)
        return torch.ops.mkldnn._linear_pointwise(x, self._packed[1], self.bias, "none", [], "")


class Fused(Linear):
    """HF's projections of one input (q, k, v; gate, up) as one matrix product, their outputs split after it:
    `sizes` are their widths, in order (hf.hf_parts). With it SmolLM2's bf16 decode on a CPU went from 1.97x
    to 2.21x transformers' (results/cpu-speed/ab-2026-11-28.txt)."""

    def __init__(self, d_in: int, sizes: list[int], bias: bool):
        super().__init__(d_in, sum(sizes), bias=bias)
        self.sizes = sizes

    def forward(self, x):
        return super().forward(x).split(self.sizes, dim=-1)


class Attention(nn.Module):
    def __init__(self, c: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx, self.nq, self.nkv, self.hd = layer_idx, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.qkv_proj = Fused(c.hidden_size, [self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], c.qkv_bias)
        self.o_proj = Linear(self.nq * self.hd, c.hidden_size, bias=c.o_bias)
        if c.qk_norm:  # Qwen3 normalises each head's q and k before the rotation
            self.q_norm = RMSNorm(self.hd, c.rms_norm_eps)
            self.k_norm = RMSNorm(self.hd, c.rms_norm_eps)

    def forward(self, x, cos, sin, mask=None, cache: _CacheStep | None = None):
        B, T, _ = x.shape
        if cache is not None and cache.decode and not hasattr(self, "q_norm"):
            # a decode step rotates q's and k's heads, side by side in the product's output, in one call: the
            # rotation is per head, so the same values in half its ops (on a CPU a SmolLM2 step's cost is largely
            # their number: bf16 decode 4% faster, results/cpu-speed/roof-2026-12-01.txt)
            qkv = Linear.forward(self.qkv_proj, x)   # unsplit
            n = (self.nq + self.nkv) * self.hd
            qk = apply_rope(qkv[..., :n].view(B, T, self.nq + self.nkv, self.hd), cos, sin)
            q, k = qk.split([self.nq, self.nkv], dim=2)
            v = qkv[..., n:].view(B, T, self.nkv, self.hd)
            return self.o_proj(self._decode(q, k, v, cache).reshape(B, T, -1))
        q, k, v = self.qkv_proj(x)
        q, k, v = q.view(B, T, self.nq, self.hd), k.view(B, T, self.nkv, self.hd), v.view(B, T, self.nkv, self.hd)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is None:  # plain causal forward (training, scoring): no cache at all
            o = self._attend(q, k.transpose(1, 2), v.transpose(1, 2), mask)
        elif cache.decode:
            o = self._decode(q, k, v, cache)
        else:
            o = self._prefill(q, k, v, cache)
        return self.o_proj(o.reshape(B, T, -1))

    def _attend(self, q, k, v, mask):
        """q [B, T, Hq, D] over keys/values [B, Hkv, L, D] -> [B, T, Hq, D]; causal when mask is None."""
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask, is_causal=mask is None,
                                           enable_gqa=self.nq != self.nkv)
        return o.transpose(1, 2)

    def _decode(self, q, k, v, cache: _CacheStep):
        """One token per row: write its k/v in place, attend over the row's cache."""
        kc, vc = cache.k[self.layer_idx], cache.v[self.layer_idx]
        pos = cache.positions[:, 0]
        kc[cache.rows, :, pos] = k[:, 0]
        vc[cache.rows, :, pos] = v[:, 0]
        return decode_attention(q[:, 0], kc, vc, cache.rows, cache.lengths, span=cache.span)

    def _prefill(self, q, k, v, cache: _CacheStep):
        """Ragged new tokens: write the real ones, then attend over each row's history and new tokens."""
        kc, vc = cache.k[self.layer_idx], cache.v[self.layer_idx]
        kc[cache.write_row, :, cache.write_pos] = k[cache.write_b, cache.write_t]
        vc[cache.write_row, :, cache.write_pos] = v[cache.write_b, cache.write_t]
        if cache.mask is None:   # fresh rows: causal over the new tokens (no real token sees the padding after it)
            return self._attend(q, k.transpose(1, 2), v.transpose(1, 2), None)
        L = cache.mask.shape[-1]
        return self._attend(q, kc[cache.rows, :, :L], vc[cache.rows, :, :L], cache.mask)


class MLP(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.gate_up_proj = Fused(c.hidden_size, [c.intermediate_size, c.intermediate_size], c.mlp_bias)
        self.down_proj = Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)

    def forward(self, x):
        gate, up = self.gate_up_proj(x)
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    checkpointing = False   # recompute this block's activations in backward instead of keeping them

    def __init__(self, c: ModelConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c, layer_idx)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, mask=None, cache=None):
        if self.checkpointing and cache is None and torch.is_grad_enabled():
            return checkpoint(self._forward, x, cos, sin, mask, use_reentrant=False)
        return self._forward(x, cos, sin, mask, cache)

    def _forward(self, x, cos, sin, mask=None, cache=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        c = self.config = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Block(c, i) for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(c), persistent=False)

    @property
    def device(self):
        return self.embed_tokens.weight.device

    @property
    def dtype(self):
        return self.embed_tokens.weight.dtype

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # parameters() counts a tied weight once

    def rope(self, positions: torch.Tensor):
        """cos, sin [B, T, head_dim // 2] for integer positions [B, T] (fp32, as HF computes them)."""
        freqs = positions[..., None].float() * self.inv_freq.float()
        return freqs.cos(), freqs.sin()

    def _body(self, input_ids, positions, mask=None, cache=None):
        """Embedding and all blocks, before the final norm."""
        cos, sin = self.rope(positions)
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, cache)
        return x

    def hidden_states(self, input_ids, attention_mask=None, position_ids=None) -> torch.Tensor:
        """Final-norm hidden states [B, T, hidden]. Right padding needs no mask (causal attention never looks
        ahead); left padding passes attention_mask (1 = real token) and gets positions counted from the first
        real token, as HF does."""
        B, T = input_ids.shape
        mask = None
        if attention_mask is not None:
            am = attention_mask.bool()
            if position_ids is None:
                position_ids = (am.long().cumsum(-1) - 1).clamp(min=0)
            causal = torch.ones(T, T, dtype=torch.bool, device=input_ids.device).tril()
            # every query may see itself, so a pad query's softmax is never over an empty set (no NaN)
            mask = (causal & am[:, None, :]) | torch.eye(T, dtype=torch.bool, device=input_ids.device)
            mask = mask[:, None]
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device).expand(B, T)
        return self.norm(self._body(input_ids, position_ids, mask))

    def forward(self, input_ids, attention_mask=None, position_ids=None, hidden_only=False) -> torch.Tensor:
        """Logits [B, T, vocab]: the plain causal forward, no cache. hidden_only=True returns the final-norm
        hidden states instead (what token_logprobs needs: a call through forward runs FSDP2's pre-forward hook,
        which gathers the root's sharded embed_tokens, norm and lm_head for the lm_head calls after it)."""
        h = self.hidden_states(input_ids, attention_mask, position_ids)
        return h if hidden_only else self.lm_head(h)

    # --- construction, loading, saving ---

    @classmethod
    def from_pretrained(cls, path, dtype=None, device=None) -> "Transformer":
        """A HF checkpoint directory (config.json + model.safetensors, or shards listed in
        model.safetensors.index.json), or a PACKAGED name such as "smollm2" -> model. Weights keep their stored
        dtype unless `dtype` is given."""
        path = checkpoint_dir(path)
        config = read_config(path)
        device = torch.device(device or "cpu")
        with torch.device("meta"):
            model = cls(config)
        ours = [n for n, _ in model.named_parameters(remove_duplicate=False)
                if not (config.tie_word_embeddings and n == "lm_head.weight")]
        weights = read_weights(path, {h for n in ours for h in hf_parts(n)}, config, device, dtype)
        state = {}
        for n in ours:   # a fused parameter stacks its HF tensors; any other is taken as read, not copied
            parts = [weights.pop(h) for h in hf_parts(n)]
            state[n] = torch.cat(parts) if len(parts) > 1 else parts[0]
        model.load_state_dict(state, strict=False, assign=True)
        if config.tie_word_embeddings:
            model.lm_head.weight = model.embed_tokens.weight
        model.inv_freq = rope_inv_freq(config).to(device)
        return model.eval()

    def save_pretrained(self, path):
        """Writes config.json + model.safetensors; transformers.AutoModelForCausalLM opens it as this model."""
        state = {}
        for n, p in self.named_parameters():
            module = self.get_submodule(n.rpartition(".")[0])
            parts = p.detach().split(module.sizes) if isinstance(module, Fused) else [p.detach()]
            state.update((h, t.contiguous()) for h, t in zip(hf_parts(n), parts, strict=True))
        write_checkpoint(path, self.config, self.dtype, state)


@dataclass
class Sample:
    tokens: list[int]                 # generated ids; the stop token is included when one was sampled
    logprobs: list[float]             # log-prob of each token under the distribution it was sampled from
    finish_reason: str                # "stop" | "length"
    allowed: list                     # per token: the allowed ids if a constraint masked that step, else None


# -----------------------------------------------------------------------------------------------------------
# KV-cache session and the generator


class Session:
    """A batch of live multi-turn conversations sharing one KV cache.

    Row r holds one conversation. `lengths[r]` tokens of it have k/v in the cache; `pending[r]` are tokens
    already part of the conversation whose k/v are not computed yet (the last tokens of a turn's reply, the
    sampled one and any the constraint forced after it: they are fed with the next turn's new tokens, at the
    next prefill). The cache is written in place; it grows (doubling, at most max_len, uninitialised) only
    when a turn needs more positions, so short windowed turns never pay for a long max_len, and positions are
    zeroed only once a turn reserves them (`reserve`). Rows not in a call cost nothing."""

    def __init__(self, model: Transformer, max_batch: int, max_len: int, graphs: bool | None = None):
        """graphs: decode steps replay CUDA graphs (default: cudagraphs.default_on), which adds a scratch cache
        row (row max_batch) for their padding."""
        if max_batch < 1 or max_len < 1:
            raise ValueError(f"Session needs max_batch >= 1 and max_len >= 1, got {max_batch}, {max_len}")
        self.model, self.max_batch, self.max_len = model, max_batch, max_len
        graphs = default_on(model.device) if graphs is None else graphs
        self.graphs = DecodeGraphs(self._decode_hidden, scratch_row=max_batch) if graphs else None
        self.lengths = torch.zeros(max_batch + bool(graphs), dtype=torch.long, device=model.device)  # cache rows
        self.k = self.v = None
        self.clean = 0            # positions below it are zero or written, in every row; above, uninitialised
        self._grow(min(max_len, 256))
        self.pending: dict[int, list[int]] = {}

    def reserve(self, need: int):
        """Make the first `need` positions (at most max_len) of every row readable, keeping what the cache holds.
        The cache grows uninitialised (most of a doubled cache is never reached: zero-filling it cost up to a
        second of a vault iteration); what is reserved is zeroed once, before anything reads it. Attention reads
        every row of a batch up to its longest row, and a masked position's weight 0 times uninitialised memory
        (a NaN) would be NaN; every forward reserves the positions it reads first."""
        need = min(need, self.max_len)
        if need > self.k.shape[3]:
            self._grow(need)
        if need > self.clean:
            self.k[..., self.clean:need, :] = 0
            self.v[..., self.clean:need, :] = 0
            self.clean = need

    def _grow(self, need: int):
        """A larger cache (doubling, at most max_len), holding the old one's written positions."""
        have = 0 if self.k is None else self.k.shape[3]
        c, size = self.model.config, min(self.max_len, max(need, 2 * have))
        shape = (c.num_hidden_layers, len(self.lengths), c.num_key_value_heads, size, c.head_dim)
        k, v = (torch.empty(shape, dtype=self.model.dtype, device=self.model.device) for _ in range(2))
        if self.clean:
            k[..., :self.clean, :], v[..., :self.clean, :] = self.k[..., :self.clean, :], self.v[..., :self.clean, :]
        self.k, self.v = k, v
        if self.graphs:
            self.graphs.clear()   # they hold the old cache's addresses

    def release(self, rows: list[int]):
        """Forget these conversations; their rows can be reused."""
        for r in rows:
            self._check_row(r)
            self.lengths[r] = 0
            self.pending.pop(r, None)

    def length(self, row: int) -> int:
        """Tokens in the row's history so far (cached + pending)."""
        self._check_row(row)
        return int(self.lengths[row]) + len(self.pending.get(row, []))

    def _check_row(self, r):
        if not 0 <= r < self.max_batch:
            raise ValueError(f"row {r} out of range for a Session with max_batch={self.max_batch}")

    def begin_turn(self, rows: list[int], prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """The tokens each row feeds first this turn (its pending ones, then its prompt), once every row is
        known to have room for them and `max_new_tokens` more; the pending tokens are then taken."""
        new, most = [], 0
        for r, p in zip(rows, prompts):
            self._check_row(r)
            x = self.pending.get(r, []) + [int(t) for t in p]
            if not x:
                raise ValueError(f"row {r}: nothing to condition on (empty prompt and no history)")
            need = int(self.lengths[r]) + len(x) + max_new_tokens - 1
            if need > self.max_len:
                raise ValueError(f"row {r} needs {need} cache positions but the Session has max_len="
                                 f"{self.max_len}; create it with a larger max_len or release finished rows")
            new.append(x)
            most = max(most, need)
        self.reserve(most)
        for r in rows:
            self.pending.pop(r, None)
        return new

    @torch.no_grad()
    def prefill(self, rows: list[int], new: list[list[int]]) -> torch.Tensor:
        """Append `new[i]` (ragged, non-empty) to conversation rows[i]; returns the fp32 logits [len(rows), V] after
        each row's last new token. Rows that start empty share work (a group's rollouts begin alike): the prompts'
        common prefix is computed in one row and copied into the others, a repeated prompt once and its row copied."""
        if len(rows) < 2 or bool(self.lengths[torch.tensor(rows, device=self.lengths.device)].any()):
            return self._prefill(rows, new)
        src = [new.index(x) for x in new]             # the first i whose prompt is new[i]'s
        uniq = sorted(set(src))
        p = min(len(os.path.commonprefix(new)), min(map(len, new)) - 1)   # at least a token left a row
        if p:
            self.reserve(max(map(len, new)))          # the cache grows once, not for the prefix and again after it
            self._prefill([rows[uniq[0]]], [new[uniq[0]][:p]])
            self._copy_rows([(rows[uniq[0]], rows[i]) for i in uniq[1:]])
        logits = self._prefill([rows[i] for i in uniq], [new[i][p:] for i in uniq])
        self._copy_rows([(rows[s], rows[i]) for i, s in enumerate(src) if s != i])
        return logits[[uniq.index(s) for s in src]]

    def _copy_rows(self, pairs: list[tuple[int, int]]):
        """Cache row d becomes a copy of row s, for each (s, d) (positions up to the longest s)."""
        if pairs:
            src_t, dst_t = torch.tensor(pairs, device=self.lengths.device).T
            n = int(self.lengths[src_t].max())
            self.k[:, dst_t, :, :n] = self.k[:, src_t, :, :n]
            self.v[:, dst_t, :, :n] = self.v[:, src_t, :, :n]
            self.lengths[dst_t] = self.lengths[src_t]

    def _prefill(self, rows: list[int], new: list[list[int]]) -> torch.Tensor:
        """Append `new[i]` to rows[i] in one batched call (the prefill itself)."""
        dev = self.model.device
        ids = torch.nn.utils.rnn.pad_sequence([torch.tensor(x, dtype=torch.long) for x in new], batch_first=True)
        n, rows_t = torch.tensor([len(x) for x in new], device=dev), torch.tensor(rows, device=dev)
        self.reserve(int((self.lengths[rows_t] + n).max()))    # one device read, not one per row
        step = _CacheStep.for_prefill(self, rows_t, n, ids.shape[1])
        x = self.model._body(ids.to(dev), step.positions, cache=step)
        self.lengths[step.rows] += n
        return self.model.lm_head(self.model.norm(x[torch.arange(len(rows), device=dev), n - 1])).float()

    @torch.no_grad()
    def decode(self, rows_t: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (rows_t [B] long, tokens [B] long); returns fp32 logits [B, V]."""
        h = self.graphs.run(rows_t, tokens) if self.graphs else self._decode_hidden(rows_t, tokens)
        self.lengths[rows_t] += 1
        return self.model.lm_head(h).float()

    def _decode_hidden(self, rows_t: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """One decode step up to the final-norm hidden states [B, hidden] (what a decode graph captures)."""
        step = _CacheStep.for_decode(self, rows_t)
        return self.model.norm(self.model._body(tokens[:, None], step.positions, cache=step)[:, 0])

    def feed(self, rows: list[int], chunks: list[list[int]]) -> torch.Tensor:
        """Next-token logits after feeding each row its chunk: one decode step when every chunk is a single
        token (the usual case), a ragged prefill when some row jumped forward over forced tokens."""
        if any(len(c) != 1 for c in chunks):
            return self.prefill(rows, chunks)
        dev = self.model.device
        return self.decode(torch.tensor(rows, device=dev), torch.tensor([c[0] for c in chunks], device=dev))


class _Reply:
    """One reply being generated: its Sample so far, its cache row, its constraint's cursor (None while
    unconstrained) and its tokens not fed to the model yet (the last sampled one and any forced after)."""

    def __init__(self, row: int, constraint):
        self.sample = Sample([], [], "length", [])
        self.row, self.unfed = row, []
        self.cursor = constraint.start() if constraint is not None else None
        self.free_after = constraint is not None and constraint.free_after

    def choices(self) -> list[int] | None:
        """The ids the constraint allows next; None when unconstrained."""
        return None if self.cursor is None else self.cursor.choices()

    def take(self, token: int, logprob: float, allowed, stops: Stops, max_new_tokens: int) -> bool:
        """Append a sampled token and any the constraint forces after it; True while the reply goes on."""
        self.unfed = []
        self._append(token, logprob, allowed)
        if self.cursor is not None:
            self.cursor.advance(token)
            self._jump_forward(max_new_tokens)
            done = self._completion_ends_reply()
        else:
            done = stops.hit(self.sample.tokens)
        if done:
            self.sample.finish_reason = "stop"
        return not done and len(self.sample.tokens) < max_new_tokens

    def _append(self, token, logprob, allowed):
        self.sample.tokens.append(token)
        self.sample.logprobs.append(logprob)
        self.sample.allowed.append(allowed)
        self.unfed.append(token)

    def _jump_forward(self, max_new_tokens):
        """A token the constraint forces is appended without a sampling step (its log-prob under the masked
        distribution is exactly 0) and fed with the sampled one in one chunk."""
        while (token := self.cursor.forced()) is not None and len(self.sample.tokens) < max_new_tokens:
            self.cursor.advance(token)
            self._append(token, 0.0, [token])

    def _completion_ends_reply(self) -> bool:
        """At a complete completion the constraint is over; it ends the reply unless the constraint is a head."""
        if not self.cursor.complete:
            return False
        self.cursor = None
        return not self.free_after


def generate(model, prompts: list[list[int]], max_new_tokens: int, sampling: Sampling = Sampling(), stop=(),
             tokenizer=None, seed=None, generator=None, constraint=None, session=None, rows=None) -> list[Sample]:
    """Sample a reply for every prompt, all in one batch over a KV cache; see Sample for what comes back.

    Layout: ragged, not left-padded. Each conversation owns a cache row starting at position 0, so its
    positions are its own token count and the cache holds no padding; the prefill pads the new tokens on the
    right and masks keys per row, and decoding attends over each row's own length. The same layout serves
    one-shot prompts (a temporary Session) and live multi-turn sessions (`session`, `rows`: prompts[i] are
    the new tokens of conversation rows[i]).

    Stops: EOS ids of the model config, ids in `stop`, and strings in `stop` (decoded with `tokenizer`).
    Stop rules apply while a row is unconstrained; a full-completion constraint ends the row itself.
    Randomness: `generator` (on the model's device) or `seed`; with neither, torch's global RNG."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not prompts:
        return []
    stops = Stops.parse(model.config, stop, tokenizer)
    constraint = _constraints(constraint, len(prompts))
    _check_token_ids(prompts, model.config.vocab_size)
    if generator is None and seed is not None:
        generator = torch.Generator(device=model.device).manual_seed(seed)
    session, rows = _session_rows(model, session, rows, prompts, max_new_tokens)
    replies = [_Reply(r, c) for r, c in zip(rows, constraint)]
    logits = session.prefill(rows, session.begin_turn(rows, prompts, max_new_tokens))
    live = replies                                    # in the order of the rows of `logits`
    while live:
        tokens, logprobs, allowed = _sample_next(logits, live, sampling, generator)
        live = [r for r, t, lp, a in zip(live, tokens, logprobs, allowed) if r.take(t, lp, a, stops, max_new_tokens)]
        if live:                                      # finished rows have left the batch
            logits = session.feed([r.row for r in live], [r.unfed for r in live])
    for r in replies:
        session.pending[r.row] = r.unfed  # sampled or forced, not yet fed: part of the history, prefilled next call
    return [r.sample for r in replies]


def _sample_next(logits: torch.Tensor, replies: list[_Reply], sampling: Sampling, generator=None):
    """One token per reply from its row of `logits` [len(replies), V], masked to what its constraint allows:
    (tokens, their log-probs, the allowed ids or None), one list entry per reply."""
    allowed = [r.choices() for r in replies]
    entries = [(j, ids) for j, ids in enumerate(allowed) if ids is not None]
    z = sampling.filter(logits, allow_mask(len(replies), logits.shape[-1], entries, logits.device))
    tokens, logprobs = draw(z, sampling.temperature == 0, generator)
    return tokens.tolist(), logprobs.tolist(), allowed


def _constraints(constraint: list | None, n: int) -> list:
    """One constraint per prompt (None: unconstrained); see small/grammar.py for the protocol."""
    if constraint is None:
        return [None] * n
    if len(constraint) != n:
        raise ValueError(f"constraint must have one entry per prompt ({n}), got {len(constraint)}")
    return list(constraint)


def _check_token_ids(prompts: list[list[int]], V: int):
    for p in prompts:
        if any(not 0 <= int(t) < V for t in p):
            raise ValueError(f"prompt token ids must be in [0, {V}); got {[t for t in p if not 0 <= t < V][:3]}")


def _session_rows(model, session: Session | None, rows, prompts, max_new_tokens) -> tuple[Session, list[int]]:
    """The caller's session and rows, checked; without a session, a temporary one with a row per prompt."""
    n = len(prompts)
    if session is None:
        if rows is not None:
            raise ValueError("rows= needs session=")
        return Session(model, n, max(len(p) for p in prompts) + max_new_tokens), list(range(n))
    if session.model is not model:
        raise ValueError("this session belongs to a different model")
    if rows is None or len(rows) != n or len(set(rows)) != n:
        raise ValueError(f"with session=, rows must list {n} distinct row indices (one per prompt)")
    return session, list(rows)


# -----------------------------------------------------------------------------------------------------------
# training-side log-probs


def token_logprobs(model, tokens: torch.LongTensor, mask: torch.BoolTensor, sampling: Sampling = Sampling(),
                   allowed: list | None = None, chunk_size=1024):
    """fp32 [B, T]: out[b, t] = log p(tokens[b, t] | tokens[b, :t]) where mask[b, t] and t >= 1, else 0;
    differentiable. `tokens` are right-padded. The distribution is the sampler's (`sampling`), with
    `allowed[b][t]` (allowed ids for the token at index t of row b, i.e. a sampled token's Sample.allowed entry
    at its position in the sequence), so on-policy this reproduces Sample.logprobs. Only the masked positions go
    through lm_head, `chunk_size` rows at a time under activation checkpointing, so neither forward nor backward
    holds full-vocabulary logits for the batch."""
    if tokens.dim() != 2 or mask.shape != tokens.shape:
        raise ValueError(f"tokens and mask must both be [B, T]; got {tuple(tokens.shape)} and {tuple(mask.shape)}")
    if allowed is not None and len(allowed) != tokens.shape[0]:
        raise ValueError(f"allowed must have one dict per row ({tokens.shape[0]}), got {len(allowed)}")
    m = mask.bool().clone()
    m[:, 0] = False                                   # the first token has nothing to condition on
    bi, ti = m.nonzero(as_tuple=True)
    out = torch.zeros(tokens.shape, dtype=torch.float32, device=tokens.device)
    if len(bi) == 0:
        out = out + 0 * model.embed_tokens.weight.sum()  # keeps the graph connected for an empty batch
        return out
    h = model(tokens, hidden_only=True)[bi, ti - 1]   # [N, hidden]: the state that predicts each target
    where = allowed_by_target(allowed, bi.tolist(), ti.tolist())
    return out.index_put((bi, ti), target_logprobs(model, h, tokens[bi, ti], where, sampling, chunk_size))


