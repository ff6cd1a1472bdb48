"""RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, statistics in fp32.

`rmsnorm_ref` is the spec (plain torch, used on CPU and whenever autograd needs a backward);
`rmsnorm_triton` is one Triton program per row; `rmsnorm` (imported by model.py) picks between them.
"""
import torch

from kernels._triton import check_runnable, tl, triton


def rmsnorm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


if triton is not None:  # the Triton half; absent where Triton is not installed
    @triton.jit
    def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, n_cols, x_row_stride, y_row_stride, eps,
                        BLOCK: tl.constexpr):
        """One program normalises one row. Two passes over the row in BLOCK-wide chunks (sum of squares,
        then scale and store) so any feature count works; for usual hidden sizes BLOCK covers the row and the
        second pass reads it back from cache."""
        row = tl.program_id(0).to(tl.int64)
        x_row = x_ptr + row * x_row_stride
        y_row = y_ptr + row * y_row_stride
        sum_sq = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
            sum_sq += x * x
        rstd = tl.rsqrt(tl.sum(sum_sq, axis=0) / n_cols + eps)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_row + cols, ((x * rstd) * w).to(y_ptr.dtype.element_ty), mask=mask)


    def rmsnorm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, *, block: int | None = None) -> torch.Tensor:
        """Same contract as rmsnorm_ref (x [..., N], weight [N]); forward only (no autograd graph).
        `block` overrides the chunk width (a power of two), for tests of the multi-chunk loop."""
        n = x.shape[-1]
        if weight.shape != (n,):
            raise ValueError(f"rmsnorm: weight has shape {tuple(weight.shape)}, expected ({n},) to match x's last dim")
        check_runnable(_rmsnorm_kernel, x, "rmsnorm_triton")
        x2 = x.reshape(-1, n)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
        if x2.shape[0] == 0 or n == 0:
            return y.view(x.shape)
        block = block or min(triton.next_power_of_2(n), 8192)
        _rmsnorm_kernel[(x2.shape[0],)](x2, weight.contiguous(), y, n, x2.stride(0), y.stride(0), eps, BLOCK=block,
                                        num_warps=8 if block >= 2048 else 4)
        return y.view(x.shape)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Triton on CUDA (where installed) when no gradient is needed (the kernel has no backward), the torch
    reference otherwise."""
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    if x.is_cuda and triton is not None and not needs_grad:
        return rmsnorm_triton(x, weight, eps)
    return rmsnorm_ref(x, weight, eps)
