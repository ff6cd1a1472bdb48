"""Triton where it is installed. Triton ships Linux wheels only: elsewhere `triton` and `tl` are None, each
kernel file defines only its torch reference, and every op dispatches to that reference."""
try:
    import triton
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
except ImportError:
    triton = tl = InterpretedFunction = None


def check_runnable(kernel, t, op: str):
    """Triton runs CUDA tensors; CPU tensors only in its interpreter, which triton picks when @triton.jit runs
    (i.e. when ops/ is imported), so a CPU call to a compiled kernel is a clear error instead of a crash."""
    if not (t.is_cuda or isinstance(kernel, InterpretedFunction)):
        raise ValueError(f"{op} on CPU tensors needs TRITON_INTERPRET=1 set before ops/ is imported")
