"""Fused kernels (Triton) with plain-torch references and a dispatch between them.

Use `scalelab.kernels.get_ops(backend, device_type)`; every op has the signature of the
reference of the same name in `scalelab.kernels.reference`.

  reference.py      the torch references (the numerical contract; what CPU runs use)
  dispatch.py       get_ops: auto | triton | torch
  triton_ops.py     the Triton namespace; imports Triton (an optional dependency) lazily
  attention.py      causal flash attention fwd/bwd, GQA          rms_norm.py  RMSNorm (+ residual add)
  swiglu.py         SwiGLU                                        rope.py      rotary embeddings on q, k
  fused_ce.py       chunked fused linear + cross-entropy (+ z-loss), never the full logits
  compile_check.py  compiles every kernel for sm_90 without a GPU (python -m ...)
Tests: tests/test_kernels_*.py (CPU, TRITON_INTERPRET=1). GPU figures: bench/kernels.py.
"""

from scalelab.kernels.dispatch import BACKENDS, get_ops, triton_available

__all__ = ["BACKENDS", "get_ops", "triton_available"]
