"""Rotary position embedding, "rotate-half" convention (as HF Llama/Qwen): the first and second halves of
each head dimension form the (real, imaginary) pairs.

`apply_rope_ref` is the spec (plain torch); `apply_rope_triton` runs one Triton program per (batch, position)
that rotates every head of that token, reading x through its strides (q/k are usually views of a fused
projection). The rotation is orthogonal, so its backward is the rotation by minus the angle: the same kernel
with sin negated. `apply_rope` (imported by model.py) picks between them.
"""
import torch

from ops._triton import check_runnable, tl, triton


def apply_rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D]; cos, sin [B, T, D // 2] (per-row positions, so left padding or ragged rows work)."""
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d].float(), x[..., d:].float()
    c, s = cos[:, :, None, :].float(), sin[:, :, None, :].float()
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


if triton is not None:  # the Triton half; absent where Triton is not installed
    @triton.jit
    def _rope_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, T, H, HALF,
                     sxb, sxt, sxh, sxd, scb, sct, ssb, sst, syb, syt, syh,
                     BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
        """Program (b, t): cos/sin of this position are loaded once and applied to a [heads, D/2] tile of
        each half. The output is contiguous [B, T, H, D]."""
        pid = tl.program_id(0).to(tl.int64)
        b, t = pid // T, pid % T
        heads = tl.arange(0, BLOCK_H)[:, None]
        lanes = tl.arange(0, BLOCK_HALF)[None, :]
        mask = (heads < H) & (lanes < HALF)
        c = tl.load(cos_ptr + b * scb + t * sct + lanes, mask=lanes < HALF, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + b * ssb + t * sst + lanes, mask=lanes < HALF, other=0.0).to(tl.float32)
        x_tok = x_ptr + b * sxb + t * sxt + heads * sxh
        x1 = tl.load(x_tok + lanes * sxd, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_tok + (lanes + HALF) * sxd, mask=mask, other=0.0).to(tl.float32)
        y_tok = y_ptr + b * syb + t * syt + heads * syh
        tl.store(y_tok + lanes, (x1 * c - x2 * s).to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(y_tok + lanes + HALF, (x2 * c + x1 * s).to(y_ptr.dtype.element_ty), mask=mask)


    def apply_rope_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Same contract as apply_rope_ref; forward only (`_Rope` adds the backward). x may be any strided view;
        cos/sin need a unit stride on their last dim only (a batch-broadcast expand() is fine)."""
        if x.dim() != 4 or x.shape[-1] % 2:
            raise ValueError(f"apply_rope: x must be [B, T, H, D] with an even D, got shape {tuple(x.shape)}")
        B, T, H, D = x.shape
        half = D // 2
        for name, t in (("cos", cos), ("sin", sin)):
            if t.shape != (B, T, half):
                raise ValueError(f"apply_rope: {name} has shape {tuple(t.shape)}, expected ({B}, {T}, {half})")
        check_runnable(_rope_kernel, x, "apply_rope_triton")
        cos = cos if cos.stride(-1) == 1 else cos.contiguous()
        sin = sin if sin.stride(-1) == 1 else sin.contiguous()
        y = torch.empty((B, T, H, D), dtype=x.dtype, device=x.device)
        if y.numel() == 0:
            return y
        _rope_kernel[(B * T,)](x, cos, sin, y, T, H, half,
                               *x.stride(), cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
                               y.stride(0), y.stride(1), y.stride(2),
                               BLOCK_H=triton.next_power_of_2(H), BLOCK_HALF=triton.next_power_of_2(half))
        return y


    class _Rope(torch.autograd.Function):
        """apply_rope_triton with a backward (cos and sin are constants: positions have no gradient)."""
        @staticmethod
        def forward(ctx, x, cos, sin):
            ctx.save_for_backward(cos, sin)
            return apply_rope_triton(x, cos, sin)

        @staticmethod
        def backward(ctx, dy):
            cos, sin = ctx.saved_tensors
            return apply_rope_triton(dy, cos, -sin), None, None


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Triton on CUDA (where installed), through `_Rope` when a gradient is needed; the torch reference
    otherwise."""
    if not (x.is_cuda and triton is not None):
        return apply_rope_ref(x, cos, sin)
    return _Rope.apply(x, cos, sin) if torch.is_grad_enabled() and x.requires_grad else apply_rope_triton(x, cos, sin)
