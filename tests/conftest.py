"""Shared test setup. On a machine without CUDA, TRITON_INTERPRET is set here, before any test module imports
ops/ (triton reads it when @triton.jit runs), so tests/test_kernels.py runs the Triton kernels on CPU in
Triton's interpreter; with CUDA it stays unset, the kernels compile, and tests/test_gpu.py checks them there."""
import atexit
import os
import shutil
import sys
import tempfile

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ["CRL_CACHE"] = tempfile.mkdtemp(prefix="crl-cache-")   # the lesson priors tests train stay out of ~/.cache
atexit.register(shutil.rmtree, os.environ["CRL_CACHE"], ignore_errors=True)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

torch.set_num_threads(min(2, os.cpu_count() or 1))
