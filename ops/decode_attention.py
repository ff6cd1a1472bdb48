"""Decode attention: one new query token per row against that row's KV cache (grouped-query attention,
ragged cache lengths, rows addressed by index into a preallocated cache).

`decode_attention_ref` is the spec (plain torch); `decode_attention_sdpa` the same through torch's fused
attention (the CPU path in bf16); `decode_attention_triton` runs one Triton program per
(query row, kv head) that serves all the query heads sharing that kv head, so each cache block is read
once per group, and walks the row's valid cache in blocks with an online softmax and matrix-unit dot
products (flash-decoding style, without the split across programs: on an H200 a split whose merge was a torch
step ran 2.6-3.8x slower at 2-8k positions, results/gpu/h200-call5.txt). `decode_attention` (imported by
model.py) picks between them.
"""
import functools
import math

import torch
import torch.nn.functional as F

from ops._triton import check_runnable, tl, triton


def decode_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         rows: torch.Tensor, lengths: torch.Tensor, scale: float | None = None,
                         span: "ReadSpan | None" = None) -> torch.Tensor:
    """q [B, Hq, D]; k_cache, v_cache [Bmax, Hkv, L, D]; rows [B] (cache row of each query);
    lengths [B] (valid cache entries of that row, the new token's own k/v already written) -> [B, Hq, D].
    `span`: the ReadSpan of rows and lengths, when the caller shares one between layers."""
    B, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    span = span or ReadSpan(rows, lengths)
    k = span.take(k_cache).float()                           # [B, Hkv, n, D]
    v = span.take(v_cache).float()
    qg = q.float().view(B, Hkv, Hq // Hkv, D)                # query heads grouped by their kv head (GQA)
    s = (qg @ k.transpose(-1, -2)) * scale                   # [B, Hkv, G, n]
    s = s.masked_fill(~span.valid[:, None, None, :], float("-inf"))
    return (s.softmax(-1) @ v).reshape(B, Hq, D).to(q.dtype)


def decode_attention_sdpa(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          rows: torch.Tensor, lengths: torch.Tensor, scale: float | None = None,
                          span: "ReadSpan | None" = None) -> torch.Tensor:
    """Same contract, through torch's fused attention on the cache in its own dtype (it accumulates in fp32):
    on CPU the reference's fp32 copy of a bf16 cache costs more than the attention. The query heads that share
    a kv head stand as that head's queries, so each cache block is read once per group."""
    B, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    span = span or ReadSpan(rows, lengths)
    o = F.scaled_dot_product_attention(q.view(B, Hkv, Hq // Hkv, D), span.take(k_cache), span.take(v_cache),
                                       attn_mask=span.valid[:, None, None, :], scale=scale)
    return o.reshape(B, Hq, D)


class ReadSpan:
    """What the torch paths read of a cache in one decode step: each of `rows`' first n positions (n the longest
    row's length), of which position i of row b is valid while i < lengths[b]. Worked out on first use and then
    shared by every layer of the step (the layers read the same rows: checking them in each of SmolLM2's 30
    layers cost a device read and a comparison each)."""

    def __init__(self, rows: torch.Tensor, lengths: torch.Tensor):
        self.rows, self.lengths = rows, lengths

    @functools.cached_property
    def n(self) -> int:
        return int(self.lengths.max())

    @functools.cached_property
    def first(self) -> int | None:
        """The first row when the rows are consecutive (a batch's usual case), else None."""
        r0 = int(self.rows[0])
        return r0 if torch.equal(self.rows, torch.arange(r0, r0 + len(self.rows), device=self.rows.device)) else None

    @functools.cached_property
    def valid(self) -> torch.Tensor:
        return torch.arange(self.n, device=self.rows.device)[None, :] < self.lengths[:, None]

    def take(self, cache: torch.Tensor) -> torch.Tensor:
        """cache[rows, :, :n]: a view where the rows are consecutive, else a copy of those rows' first n
        positions. Indexing with a tensor and a slice at once takes a slow gather on CPU (a 25M model's decode
        spent a fifth of its time there)."""
        if self.first is not None:
            return cache[self.first:self.first + len(self.rows), :, :self.n]
        return cache[:, :, :self.n].index_select(0, self.rows)


if triton is not None:  # the Triton half; absent where Triton is not installed
    @triton.jit
    def _decode_attention_kernel(q_ptr, k_ptr, v_ptr, rows_ptr, lengths_ptr, o_ptr, scale,
                                 GROUP, D,
                                 sqb, sqh, skb, skh, skn, svb, svh, svn, sob, soh,
                                 BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                                 PRECISION: tl.constexpr):
        """Program (b, kv head j): q heads j*GROUP .. j*GROUP+GROUP-1 form a [BLOCK_G, BLOCK_D] tile (padded to
        the 16 rows a matrix instruction needs). For each block of BLOCK_N cache positions the scores
        [BLOCK_G, BLOCK_N] and the weighted values are two tl.dot products around the usual online softmax
        (running max m, normaliser l, accumulator). The operands are fp32 (Triton's interpreter miscomputes
        bf16 dots): tf32 for a bf16 cache, whose values tf32 holds exactly, IEEE fp32 for an fp32 one.
        Padded lanes load zeros and are never stored; positions past the row's length get a score of -inf. The
        head dim is assumed contiguous (stride 1) in q, k, v and o."""
        b = tl.program_id(0).to(tl.int64)
        kv_head = tl.program_id(1).to(tl.int64)
        row = tl.load(rows_ptr + b).to(tl.int64)
        length = tl.load(lengths_ptr + b)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        n = tl.arange(0, BLOCK_N)
        q_mask = (g[:, None] < GROUP) & (d[None, :] < D)
        q_heads = kv_head * GROUP + g
        q = tl.load(q_ptr + b * sqb + q_heads[:, None] * sqh + d[None, :], mask=q_mask, other=0.0).to(tl.float32)
        k_row = k_ptr + row * skb + kv_head * skh
        v_row = v_ptr + row * svb + kv_head * svh
        m = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
        l = tl.zeros([BLOCK_G], dtype=tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
        for start in range(0, length, BLOCK_N):
            pos = start + n
            kv_mask = (pos[:, None] < length) & (d[None, :] < D)
            k = tl.load(k_row + pos[:, None] * skn + d[None, :], mask=kv_mask, other=0.0).to(tl.float32)
            v = tl.load(v_row + pos[:, None] * svn + d[None, :], mask=kv_mask, other=0.0).to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale   # [BLOCK_G, BLOCK_N]
            s = tl.where(pos[None, :] < length, s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))  # finite: every block holds at least one valid position
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            l = l * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
            m = m_new
        out = acc / l[:, None]
        tl.store(o_ptr + b * sob + q_heads[:, None] * soh + d[None, :], out.to(o_ptr.dtype.element_ty), mask=q_mask)


    def decode_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                rows: torch.Tensor, lengths: torch.Tensor, scale: float | None = None,
                                *, block_n: int | None = None) -> torch.Tensor:
        """Same contract as decode_attention_ref (every length must be >= 1). `block_n` overrides the number of
        cache positions per step (a power of two, at least 16; default 64)."""
        if q.dim() != 3 or k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
            raise ValueError(f"decode_attention: expected q [B, Hq, D] and k/v caches [Bmax, Hkv, L, D] of one shape, "
                             f"got q {tuple(q.shape)}, k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)}")
        B, Hq, D = q.shape
        Hkv = k_cache.shape[1]
        if k_cache.shape[3] != D or Hq % Hkv:
            raise ValueError(f"decode_attention: q heads {Hq} must be a multiple of kv heads {Hkv} and head dims "
                             f"must match (q {D}, cache {k_cache.shape[3]})")
        if rows.shape != (B,) or lengths.shape != (B,):
            raise ValueError(f"decode_attention: rows and lengths must have shape ({B},), "
                             f"got {tuple(rows.shape)} and {tuple(lengths.shape)}")
        check_runnable(_decode_attention_kernel, q, "decode_attention_triton")
        scale = scale if scale is not None else 1.0 / math.sqrt(D)
        q, k_cache, v_cache = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k_cache, v_cache))
        out = torch.empty((B, Hq, D), dtype=q.dtype, device=q.device)
        if B == 0:
            return out
        group = Hq // Hkv
        block_g, block_d = max(16, triton.next_power_of_2(group)), max(16, triton.next_power_of_2(D))
        _decode_attention_kernel[(B, Hkv)](
            q, k_cache, v_cache, rows.contiguous(), lengths.contiguous(), out, scale, group, D,
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1),
            BLOCK_G=block_g, BLOCK_N=block_n or 64, BLOCK_D=block_d,
            PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
        return out


def decode_attention(q, k_cache, v_cache, rows, lengths, scale=None, span=None):
    """Triton on CUDA (where installed) when no gradient is needed (the kernel has no backward; decoding never
    needs one); otherwise the torch reference in fp32 (the same numbers as ever) and torch's fused attention in
    a narrower dtype (the reference's fp32 copy of the cache was half of a bf16 SmolLM2 decode step on CPU)."""
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k_cache, v_cache))
    if q.is_cuda and triton is not None and not needs_grad:
        return decode_attention_triton(q, k_cache, v_cache, rows, lengths, scale)
    if q.dtype != torch.float32:
        return decode_attention_sdpa(q, k_cache, v_cache, rows, lengths, scale, span)
    return decode_attention_ref(q, k_cache, v_cache, rows, lengths, scale, span)
