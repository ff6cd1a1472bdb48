"""RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, statistics in fp32.

`rmsnorm_ref` is the spec (plain torch, used on CPU); `rmsnorm_triton` is one Triton program per row, with
a Triton backward when autograd needs one; `rmsnorm` (imported by model.py) picks between them.
"""
import torch

from ops._triton import check_runnable, tl, triton


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


    @triton.jit
    def _rmsnorm_bwd_kernel(x_ptr, w_ptr, dy_ptr, dx_ptr, dw_ptr, n_rows, n_cols, x_row_stride, dy_row_stride,
                            eps, BLOCK: tl.constexpr):
        """Program p takes rows p, p + P, p + 2P, ... (P programs), each in one BLOCK-wide chunk: with
        g = dy * w and r = rsqrt(mean(x^2) + eps) recomputed from x, dx = r * (g - x * r^2 * mean(g * x)); its
        share of dw = sum over rows of dy * x * r is kept in registers and stored as row p of a [P, N] buffer."""
        pid = tl.program_id(0).to(tl.int64)   # the row index below is int64 too: no 32-bit offset overflow
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        dw = tl.zeros([BLOCK], dtype=tl.float32)
        for row in range(pid, n_rows, tl.num_programs(0)):
            x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + row * dy_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
            rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
            g = dy * w
            dx = rstd * (g - x * (rstd * rstd) * (tl.sum(g * x, axis=0) / n_cols))
            tl.store(dx_ptr + row * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            dw += dy * x * rstd
        tl.store(dw_ptr + pid * n_cols + cols, dw, mask=mask)


    class _RMSNorm(torch.autograd.Function):
        """rmsnorm_triton with a backward: saves x (in its own dtype) and recomputes the statistics."""
        @staticmethod
        def forward(ctx, x, weight, eps):
            ctx.save_for_backward(x, weight)
            ctx.eps = eps
            return rmsnorm_triton(x, weight, eps)

        @staticmethod
        def backward(ctx, dy):
            x, weight = ctx.saved_tensors
            n = x.shape[-1]
            x2, dy2 = x.reshape(-1, n), dy.reshape(-1, n)
            x2, dy2 = (t if t.stride(-1) == 1 else t.contiguous() for t in (x2, dy2))
            programs = max(1, min(x2.shape[0], BACKWARD_PROGRAMS))
            dx = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
            dw = torch.empty(programs, n, dtype=torch.float32, device=x.device)
            _rmsnorm_bwd_kernel[(programs,)](x2, weight, dy2, dx, dw, x2.shape[0], n, x2.stride(0), dy2.stride(0),
                                             ctx.eps, BLOCK=triton.next_power_of_2(n), num_warps=8 if n >= 2048 else 4)
            return dx.view(x.shape), dw.sum(0).to(weight.dtype), None


    def rmsnorm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, *, block: int | None = None) -> torch.Tensor:
        """Same contract as rmsnorm_ref (x [..., N], weight [N]); forward only (no autograd graph; `_RMSNorm`
        adds the backward). `block` overrides the chunk width (a power of two), for tests of the multi-chunk
        loop."""
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


BACKWARD_MAX_N = 8192   # the backward holds a row in one chunk; wider rows (no model here has them) take the ref
BACKWARD_PROGRAMS = 1024   # at most this many backward programs, each summing its rows' share of dw


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Triton on CUDA (where installed), through `_RMSNorm` when a gradient is needed; the torch reference
    otherwise."""
    if not (x.is_cuda and triton is not None):
        return rmsnorm_ref(x, weight, eps)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return _RMSNorm.apply(x, weight, eps) if x.shape[-1] <= BACKWARD_MAX_N else rmsnorm_ref(x, weight, eps)
    return rmsnorm_triton(x, weight, eps)
