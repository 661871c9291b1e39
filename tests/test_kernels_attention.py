"""Triton flash attention vs the torch reference, on CPU under the Triton interpreter.

Tolerances (stated at each assert):
  fp32 kernel vs the reference in fp64: atol 2e-5, rtol 1e-4 on outputs and on dq, dk, dv
    (measured max errors ~1e-6; fp32 accumulation over T <= 100 keys).
  fp16 / bf16 kernel: its max error vs the fp64 reference must be at most 2x the error of the torch
    reference run in the same dtype, plus a floor of 2e-3 (fp16) / 2e-2 (bf16): the kernel must be no
    worse than torch's own low-precision attention.
Interpreter block sizes are 16/32, so T in {1, 33, 37, 45, 50, 100} covers single, multiple and ragged
blocks. GQA ratios 1/2/4/8 and head dims 64/128 are covered.
"""

import os

import pytest
import torch  # importing torch does not import triton

if not torch.cuda.is_available():  # CPU: the Triton interpreter, set before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA and TRITON_INTERPRET is not 1", allow_module_level=True)

from scalelab.kernels.attention import (  # noqa: E402
    _attn_fwd,  # noqa: E402
    attention,
    attention_reference,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and type(_attn_fwd).__name__ != "InterpretedFunction":
    # The interpreter is chosen when a kernel module is imported; here it was imported earlier.
    pytest.skip("scalelab.kernels was imported before TRITON_INTERPRET=1 was set", allow_module_level=True)


def _qkv(B, Hq, Hk, T, D, dtype, seed=0):
    # q/k/v made in the model's [B, T, H, Dh] layout and transposed: strided inputs, as in models/.
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, Hq, D, generator=g).transpose(1, 2)
    k = torch.randn(B, T, Hk, D, generator=g).transpose(1, 2)
    v = torch.randn(B, T, Hk, D, generator=g).transpose(1, 2)
    do = torch.randn(B, Hq, T, D, generator=g)
    cast = lambda t: t.to(DEVICE, dtype)
    return cast(q), cast(k), cast(v), cast(do)


def _run(fn, q, k, v, do, causal, dtype=None):
    leaves = [t.detach().to(dtype or t.dtype).requires_grad_() for t in (q, k, v)]
    out = fn(*leaves, causal=causal)
    grads = torch.autograd.grad(out, leaves, do.to(out.dtype))
    return [out.double(), *[g.double() for g in grads]]


@pytest.mark.parametrize(
    "Hq,Hk,T,D,causal",
    [
        (8, 8, 37, 64, True),  # GQA ratio 1 (MHA), ragged T
        (8, 4, 100, 64, True),  # ratio 2, several blocks
        (8, 2, 1, 128, True),  # ratio 4, T = 1
        (8, 1, 45, 128, True),  # ratio 8 (MQA), D = 128
        (4, 4, 50, 64, False),  # non-causal, ragged
        (4, 2, 33, 128, False),  # non-causal GQA
    ],
)
def test_fp32_forward_and_grads_match_reference(Hq, Hk, T, D, causal):
    q, k, v, do = _qkv(2, Hq, Hk, T, D, torch.float32)
    got = _run(attention, q, k, v, do, causal)
    want = _run(attention_reference, q, k, v, do, causal, dtype=torch.float64)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize(
    "dtype,Hq,Hk,T,D,floor",
    [
        (torch.float16, 8, 2, 45, 64, 2e-3),
        (torch.float16, 4, 1, 40, 128, 2e-3),
        (torch.bfloat16, 4, 2, 37, 64, 2e-2),  # bf16 dots run in fp32 in the interpreter (see _common.py)
    ],
)
def test_low_precision_no_worse_than_torch(dtype, Hq, Hk, T, D, floor):
    q, k, v, do = _qkv(1, Hq, Hk, T, D, torch.float32, seed=1)
    truth = _run(attention_reference, q, k, v, do, True, dtype=torch.float64)
    got = _run(attention, q.to(dtype), k.to(dtype), v.to(dtype), do.to(dtype), True)
    torch_lowp = _run(attention_reference, q, k, v, do, True, dtype=dtype)
    for name, a, t, r in zip(("out", "dq", "dk", "dv"), got, truth, torch_lowp):
        err, ref_err = (a - t).abs().max().item(), (r - t).abs().max().item()
        # tolerance: kernel error <= 2 x torch's own error in this dtype + floor
        assert err <= 2 * ref_err + floor, f"{name}: kernel err {err:.3g} vs torch {ref_err:.3g}"


def test_causal_mask_future_keys_do_not_matter():
    q, k, v, do = _qkv(1, 4, 2, 40, 64, torch.float32, seed=2)
    t_cut = 21  # rows < t_cut must ignore keys/values at positions >= t_cut
    k2, v2 = k.clone(), v.clone()
    k2[:, :, t_cut:] = torch.randn_like(k2[:, :, t_cut:]) * 10
    v2[:, :, t_cut:] = torch.randn_like(v2[:, :, t_cut:]) * 10
    o1 = attention(q, k, v, causal=True)
    o2 = attention(q, k2, v2, causal=True)
    assert torch.equal(o1[:, :, :t_cut], o2[:, :, :t_cut])  # exact: masked keys contribute exactly 0
    assert not torch.allclose(o1[:, :, t_cut:], o2[:, :, t_cut:])
    # gradient: a loss on early rows gives exactly zero gradient to future keys and values
    k3, v3 = k.clone().requires_grad_(), v.clone().requires_grad_()
    out = attention(q, k3, v3, causal=True)
    out[:, :, :t_cut].sum().backward()
    assert torch.count_nonzero(k3.grad[:, :, t_cut:]) == 0
    assert torch.count_nonzero(v3.grad[:, :, t_cut:]) == 0
    assert torch.count_nonzero(k3.grad[:, :, :t_cut]) > 0


def test_rejects_bad_shapes_and_dtypes():
    q, k, v, _ = _qkv(1, 4, 2, 8, 64, torch.float32)
    with pytest.raises(ValueError, match="T == S"):
        attention(q, k[:, :, :4], v[:, :, :4], causal=True)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        attention(q[:, :3], k, v)
    with pytest.raises(TypeError, match="float64"):
        attention(q.double(), k.double(), v.double())
