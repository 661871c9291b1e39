"""Small helpers shared by the Triton kernel modules: dtype mapping, interpreter detection, checks.

Everything here is host-side Python; the kernels themselves live in attention.py, rms_norm.py,
swiglu.py, rope.py and fused_ce.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# The dtypes the Triton kernels accept. float64 is left to the torch references (kernels: torch):
# the kernels keep fp32 scalars (softmax scale, eps) and fp32 accumulators.
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

_TL_DTYPE = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def interpreting(t: torch.Tensor) -> bool:
    """True when the kernel will run in the Triton interpreter (CPU tensors, TRITON_INTERPRET=1)."""
    return t.device.type == "cpu"


def tl_dtype(dtype: torch.dtype):
    return _TL_DTYPE[dtype]


def dot_dtype(t: torch.Tensor):
    """The operand dtype for tl.dot on tensors like `t`.

    In the interpreter bf16 tl.dot is wrong (numpy multiplies the raw uint16 bit patterns), so bf16
    operands are cast to fp32 there. On a GPU the native dtype goes to the tensor cores.
    """
    if interpreting(t) and t.dtype == torch.bfloat16:
        return tl.float32
    return _TL_DTYPE[t.dtype]


def dot_precision(t: torch.Tensor) -> str:
    """'ieee' for fp32 inputs (tf32 would lose ~3 digits vs the fp32 reference), else 'tf32' (ignored)."""
    return "ieee" if t.dtype == torch.float32 else "tf32"


def check_dtype(name: str, t: torch.Tensor) -> None:
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"{name} has dtype {t.dtype}; the Triton kernels take float16/bfloat16/float32 "
            "(use kernels: torch for float64)"
        )


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))
