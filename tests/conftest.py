"""Shared test setup.

- TRITON_INTERPRET=1 on machines without CUDA, set before anything imports triton, so the Triton
  kernels run (slowly, exactly) on CPU.
- SCALELAB_CACHE points at one temporary directory for the whole session, so the default corpus is
  prepared once per test session and never touches the user's ~/.cache.
- wandb never talks to the network in tests.
"""

import os
import tempfile

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("SCALELAB_CACHE", tempfile.mkdtemp(prefix="scalelab-test-cache-"))
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
