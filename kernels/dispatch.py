"""Pick a kernel implementation: Triton on CUDA, the torch reference elsewhere.

`get_ops(backend)` returns a namespace with rms_norm, swiglu, apply_rope, attention and
fused_linear_cross_entropy, all with the signatures of `scalelab.kernels.reference`.

  backend="torch"  -> always the references
  backend="triton" -> the Triton kernels (CUDA, or CPU under TRITON_INTERPRET=1); errors if unavailable
  backend="auto"   -> Triton when the tensors will live on CUDA and Triton imports, else torch
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import torch

from scalelab.errors import ConfigError
from scalelab.kernels import reference

BACKENDS = ("auto", "triton", "torch")


def triton_available() -> bool:
    """True when Triton imports and there is a CUDA device or the interpreter is on."""
    try:
        import triton  # noqa: F401  (optional extra: scalelab[triton])
    except Exception:
        return False
    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


def _reference_ops() -> SimpleNamespace:
    return SimpleNamespace(
        name="torch",
        rms_norm=reference.rms_norm,
        swiglu=reference.swiglu,
        apply_rope=reference.apply_rope,
        attention=reference.attention,
        fused_linear_cross_entropy=reference.fused_linear_cross_entropy,
    )


def _triton_ops() -> SimpleNamespace:
    from scalelab.kernels import triton_ops  # imported lazily: Triton is an optional extra

    return triton_ops.ops()


def get_ops(backend: str = "auto", device_type: str = "cpu") -> SimpleNamespace:
    """Return the kernel namespace for `backend` ('auto' | 'triton' | 'torch') on `device_type`."""
    if backend not in BACKENDS:
        raise ConfigError("model.kernels", f"{backend!r} is not one of {BACKENDS}", "use one of them")
    if backend == "torch":
        return _reference_ops()
    if backend == "triton":
        if not triton_available():
            raise ConfigError(
                "model.kernels",
                "'triton' needs Triton with a CUDA device (or TRITON_INTERPRET=1 for CPU tests)",
                "set kernels: auto or torch",
            )
        return _triton_ops()
    # auto: Triton only where it pays (CUDA); the interpreter is for tests, never chosen by auto.
    if device_type == "cuda" and triton_available():
        try:
            return _triton_ops()
        except ImportError:
            pass
    return _reference_ops()
