"""Hot-path kernels for model.py. Each op has a plain torch reference (the spec, used on CPU) and a Triton
kernel (used on CUDA, and tested on CPU under TRITON_INTERPRET=1 against the reference).

Each file holds `<op>_ref` (torch), `<op>_triton` (Triton, same signature) and the dispatch function
re-exported here, which takes the Triton path for CUDA tensors and the reference otherwise. Triton is
optional (it ships Linux wheels only): without it `<op>_triton` is absent and every op runs its reference.
The re-exports shadow the submodule names (`ops.rmsnorm` is the function here); reach a module itself
with `importlib.import_module("ops.rmsnorm")`. Triton reads TRITON_INTERPRET when @triton.jit runs,
i.e. when these modules are first imported: set it before that to run the Triton path on CPU tensors.
"""
from ops.rmsnorm import rmsnorm
from ops.rope import apply_rope
from ops.decode_attention import decode_attention
from ops.logsoftmax import selective_log_softmax
