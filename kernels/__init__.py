"""Fused kernels (Triton) with plain-torch references and a dispatch between them.

Use `scalelab.kernels.get_ops(backend, device_type)`; every op has the signature of the
reference of the same name in `scalelab.kernels.reference`.
"""

from scalelab.kernels.dispatch import BACKENDS, get_ops, triton_available

__all__ = ["BACKENDS", "get_ops", "triton_available"]
