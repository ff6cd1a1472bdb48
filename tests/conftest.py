"""Shared test setup. TRITON_INTERPRET must be set before triton compiles any kernel, so it is set here,
before any test module imports kernels/; on a CPU machine the Triton path only ever runs in tests."""
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

torch.set_num_threads(min(2, os.cpu_count() or 1))
