"""Selective log-softmax: log p(target) = logit[target] - logsumexp(logits), without materialising the
softmax (or an fp32 copy of bf16 logits).

`selective_log_softmax_ref` is the spec (plain torch autograd). `selective_log_softmax_triton` is an
autograd.Function with two Triton kernels, one program per row each: the forward streams the row once in
blocks with an online max / sum-of-exponentials and keeps only the row's logsumexp (4 bytes) for the
backward, which recomputes softmax blockwise and writes grad_logits = g * (onehot(target) - softmax).
On a CPU, where a gradient is wanted, `_InPlaceBackward` computes the reference's values a block of rows at a time,
with that same backward written in place. `selective_log_softmax` (imported by sampling.py's target_logprobs, which
model.py's token_logprobs calls) picks between them.
"""
import torch

from ops._triton import check_runnable, tl, triton


def selective_log_softmax_ref(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits [N, V] (any float dtype), targets [N] -> [N] fp32, differentiable w.r.t. logits."""
    lf = logits.float()
    return lf.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(lf, dim=-1)


if triton is not None:  # the Triton half; absent where Triton is not installed
    @triton.jit
    def _logsoftmax_fwd_kernel(logits_ptr, targets_ptr, out_ptr, lse_ptr, V, row_stride, BLOCK: tl.constexpr):
        """Online logsumexp over the row: m is the running max, s the sum of exp(x - m) rescaled whenever m
        grows. Logits of -inf (masked tokens) are allowed: while everything seen is -inf the shift is 0, so
        no -inf - -inf ever turns into NaN."""
        row = tl.program_id(0).to(tl.int64)
        row_ptr = logits_ptr + row * row_stride
        m = tl.full([], float("-inf"), dtype=tl.float32)
        s = tl.zeros([], dtype=tl.float32)
        for start in range(0, V, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(row_ptr + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            s = s * tl.exp(m - shift) + tl.sum(tl.exp(x - shift), axis=0)
            m = m_new
        lse = m + tl.log(s)
        target = tl.load(targets_ptr + row).to(tl.int64)
        x_target = tl.load(row_ptr + target).to(tl.float32)
        tl.store(out_ptr + row, x_target - lse)
        tl.store(lse_ptr + row, lse)


    @triton.jit
    def _logsoftmax_bwd_kernel(grad_out_ptr, logits_ptr, targets_ptr, lse_ptr, grad_logits_ptr, V,
                               row_stride, grad_row_stride, BLOCK: tl.constexpr):
        """d out / d logit_j = onehot(j == target) - softmax_j, times the incoming gradient of the row."""
        row = tl.program_id(0).to(tl.int64)
        g = tl.load(grad_out_ptr + row).to(tl.float32)
        lse = tl.load(lse_ptr + row)
        target = tl.load(targets_ptr + row).to(tl.int64)
        for start in range(0, V, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < V
            x = tl.load(logits_ptr + row * row_stride + cols, mask=mask, other=float("-inf")).to(tl.float32)
            onehot = tl.where(cols == target, 1.0, 0.0)
            grad = g * (onehot - tl.exp(x - lse))
            tl.store(grad_logits_ptr + row * grad_row_stride + cols, grad.to(grad_logits_ptr.dtype.element_ty),
                     mask=mask)


    def _default_block(V: int) -> int:
        return min(triton.next_power_of_2(V), 4096)


    def _num_warps(block: int) -> int:
        return 8 if block >= 2048 else 4


    class _SelectiveLogSoftmax(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, targets, block):
            N, V = logits.shape
            out = torch.empty(N, dtype=torch.float32, device=logits.device)
            lse = torch.empty(N, dtype=torch.float32, device=logits.device)
            if N > 0:
                _logsoftmax_fwd_kernel[(N,)](logits, targets, out, lse, V, logits.stride(0), BLOCK=block,
                                             num_warps=_num_warps(block))
            ctx.save_for_backward(logits, targets, lse)
            ctx.block = block
            return out

        @staticmethod
        def backward(ctx, grad_out):
            logits, targets, lse = ctx.saved_tensors
            N, V = logits.shape
            grad_logits = torch.empty((N, V), dtype=logits.dtype, device=logits.device)
            if N > 0:
                _logsoftmax_bwd_kernel[(N,)](grad_out.contiguous(), logits, targets, lse, grad_logits, V,
                                             logits.stride(0), grad_logits.stride(0), BLOCK=ctx.block,
                                             num_warps=_num_warps(ctx.block))
            return grad_logits, None, None


    def selective_log_softmax_triton(logits: torch.Tensor, targets: torch.Tensor, *,
                                     block: int | None = None) -> torch.Tensor:
        """Same contract as selective_log_softmax_ref, forward and backward. Targets are not range-checked on
        the GPU (that would cost a device sync); `block` overrides the column block width (a power of two)."""
        if logits.dim() != 2 or targets.shape != (logits.shape[0],):
            raise ValueError(f"selective_log_softmax: expected logits [N, V] and targets [N], "
                             f"got {tuple(logits.shape)} and {tuple(targets.shape)}")
        if not logits.is_floating_point() or targets.is_floating_point():
            raise ValueError(f"selective_log_softmax: logits must be float and targets integer, "
                             f"got {logits.dtype} and {targets.dtype}")
        check_runnable(_logsoftmax_fwd_kernel, logits, "selective_log_softmax_triton")
        if logits.stride(-1) != 1:
            logits = logits.contiguous()
        return _SelectiveLogSoftmax.apply(logits, targets.contiguous(), block or _default_block(logits.shape[1]))


_ROWS = 16   # rows a block: their fp32 working set (3 MB at a 49k vocabulary) stays in a CPU's cache


class _InPlaceBackward(torch.autograd.Function):
    """The reference's values, forward and backward, computed a block of `_ROWS` rows at a time, the backward in
    place: grad_logits = g * (onehot(target) - exp(logits - logsumexp)). Autograd through the reference makes the
    [N, V] fp32 tensors whole (the logsumexp's shift and exponential; in the backward the shift, its exponential,
    the product, the gather's zeros); on a CPU every fresh 200 MB buffer is first paid for in page faults, and each
    of its passes streams from memory. A row's values never depend on another row's, so the blocks give the same
    operations on the same values in the same order: the log-probs and gradients are bit-equal."""

    @staticmethod
    def forward(ctx, logits, targets):
        lse = torch.cat([torch.logsumexp(b.float(), dim=-1) for b in logits.split(_ROWS)])
        ctx.save_for_backward(logits, targets, lse)
        return logits.gather(-1, targets[:, None]).squeeze(-1).float() - lse

    @staticmethod
    def backward(ctx, g):
        logits, targets, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for x, out, l, gb, t in zip(*(a.split(_ROWS) for a in (logits, grad, lse, g, targets))):
            x = x.to(torch.float32, copy=True)
            x.sub_(l[:, None]).exp_().mul_(-gb[:, None]).add_(0.0)   # + 0: autograd's sum turns -0.0 into 0.0
            out.copy_(x.scatter_add_(-1, t[:, None], gb[:, None]))
        return grad, None


def selective_log_softmax(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Triton on CUDA where installed (it has its own backward); elsewhere the reference, through its in-place
    backward when a gradient is wanted."""
    if logits.is_cuda and triton is not None:
        return selective_log_softmax_triton(logits, targets)
    if torch.is_grad_enabled() and logits.requires_grad:
        return _InPlaceBackward.apply(logits, targets)
    return selective_log_softmax_ref(logits, targets)
