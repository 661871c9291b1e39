"""Triton RMSNorm(+residual), SwiGLU, RoPE and fused linear cross-entropy vs the torch references,
and the kernel dispatch; on CPU under the Triton interpreter.

Tolerances (stated at each assert):
  fp32 kernel vs the reference in fp64: atol 1e-5, rtol 1e-5 for elementwise ops (outputs and grads;
    measured ~1e-6), atol 1e-6, rtol 1e-5 for the CE loss and its gradients (values are O(1e-2)).
  fp16 / bf16 kernel: max error vs the fp64 reference at most 2x the torch reference's own error in
    that dtype plus a floor (fp16 2e-3, bf16 2e-2): no worse than torch at the same precision.
Shapes are odd on purpose: rows 37 and hidden 100/1000 (not powers of two), vocab 1000 (not a multiple
of 64), 37 tokens in chunks of 16 (ragged last chunk), a single token (T = 1).
"""

import inspect
import os

import pytest
import torch  # importing torch does not import triton

if not torch.cuda.is_available():  # CPU: the Triton interpreter, set before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA and TRITON_INTERPRET is not 1", allow_module_level=True)

from scalelab.kernels import get_ops, reference  # noqa: E402
from scalelab.kernels.attention import _attn_fwd  # noqa: E402
from scalelab.kernels.fused_ce import default_chunk_size  # noqa: E402
from scalelab.kernels.triton_ops import ops  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and type(_attn_fwd).__name__ != "InterpretedFunction":
    # The interpreter is chosen when a kernel module is imported; here it was imported earlier.
    pytest.skip("scalelab.kernels was imported before TRITON_INTERPRET=1 was set", allow_module_level=True)
K = ops()
FLOORS = {torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _grads(fn, inputs, dtype, seed=0):
    """Outputs and input gradients (as float64) of fn(*inputs cast to dtype) for fixed random cotangents."""
    leaves = [t.detach().to(DEVICE, dtype).requires_grad_() for t in inputs]
    out = fn(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    g = torch.Generator().manual_seed(seed)
    cot = [torch.randn(o.shape, generator=g).to(DEVICE, o.dtype) for o in outs]
    grads = torch.autograd.grad(outs, leaves, cot)
    return [o.double() for o in outs] + [x.double() for x in grads]


def _check(kernel_fn, ref_fn, inputs, dtype, atol=1e-5, rtol=1e-5):
    got = _grads(kernel_fn, inputs, dtype)
    truth = _grads(ref_fn, inputs, torch.float64)
    assert len(got) == len(truth)
    if dtype == torch.float32:
        for i, (a, b) in enumerate(zip(got, truth)):
            torch.testing.assert_close(a, b, atol=atol, rtol=rtol, msg=lambda m, i=i: f"tensor {i}: {m}")
        return
    torch_lowp = _grads(ref_fn, inputs, dtype)
    for i, (a, t, r) in enumerate(zip(got, truth, torch_lowp)):
        err, ref_err = (a - t).abs().max().item(), (r - t).abs().max().item()
        # tolerance: kernel error <= 2 x torch's own error in this dtype + floor
        assert err <= 2 * ref_err + FLOORS[dtype], f"tensor {i}: kernel err {err:.3g} vs torch {ref_err:.3g}"


DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm(dtype):
    g = torch.Generator().manual_seed(0)
    # 111 rows of 1000: 7 row tiles of 16 in the interpreter, looped over by 4 backward programs
    x, w = torch.randn(3, 37, 1000, generator=g), torch.randn(1000, generator=g)
    _check(lambda x, w: K.rms_norm(x, w, 1e-5), lambda x, w: reference.rms_norm(x, w, 1e-5), [x, w], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_fused_residual(dtype):
    g = torch.Generator().manual_seed(1)
    x, r = torch.randn(2, 19, 100, generator=g), torch.randn(2, 19, 100, generator=g)
    w = torch.randn(100, generator=g)
    kern = lambda x, w, r: K.rms_norm(x, w, 1e-6, residual=r)
    ref = lambda x, w, r: reference.rms_norm(x, w, 1e-6, residual=r)
    _check(kern, ref, [x, w, r], dtype)  # both outputs (normed, x + r) and all three gradients


def test_rms_norm_residual_only_sum_used():
    # Only the residual stream s is used downstream: the normed output gets no gradient.
    x, w, r = torch.randn(5, 64), torch.randn(64), torch.randn(5, 64)
    x.requires_grad_()
    _, s = K.rms_norm(x, w, 1e-5, residual=r)
    (s * 3).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0), atol=0, rtol=0)  # exact


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_on_halves_of_a_fused_projection(dtype):
    g = torch.Generator().manual_seed(2)
    # gate/up are strided views of one tensor; F = 1100: 2 column tiles x 3 row tiles (interpreter)
    gate_up = torch.randn(2, 23, 2 * 1100, generator=g)
    _check(lambda a: K.swiglu(*a.chunk(2, -1)), lambda a: reference.swiglu(*a.chunk(2, -1)), [gate_up], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,Hq,Hk,D", [(37, 4, 2, 128), (1, 8, 1, 64)])  # q: 296 rows = 2 tiles of 256
def test_rope(dtype, T, Hq, Hk, D):
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, T, Hq, D, generator=g), torch.randn(2, T, Hk, D, generator=g)
    cos, sin = reference.rope_cos_sin(T + 5, D)
    cos, sin = cos[5:].to(DEVICE), sin[5:].to(DEVICE)  # a strided slice of a longer table, offset 5
    kern = lambda q, k: K.apply_rope(q, k, cos, sin)
    ref = lambda q, k: reference.apply_rope(q, k, cos.double(), sin.double())
    _check(kern, ref, [q, k], dtype)


def _ce_inputs(n=37, d=32, v=1000, seed=4):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=g)
    weight = torch.randn(v, d, generator=g) * 0.3
    targets = torch.randint(0, v, (n,), generator=g)
    if n > 8:
        targets[[3, 7, n - 1]] = -100  # ignored positions, one in the ragged last chunk
    return hidden, weight, targets.to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("z_loss", [0.0, 1e-3])
def test_fused_linear_cross_entropy(dtype, z_loss):
    hidden, weight, targets = _ce_inputs()
    kern = lambda h, w: K.fused_linear_cross_entropy(h, w, targets, z_loss=z_loss, chunk_size=16)
    ref = lambda h, w: reference.fused_linear_cross_entropy(h, w, targets, z_loss=z_loss)
    _check(kern, ref, [hidden, weight], dtype, atol=1e-6, rtol=1e-5)


def test_fused_ce_single_token_all_ignored_and_grad_scaling():
    hidden, weight, targets = _ce_inputs(n=1, v=130)
    _check(
        lambda h, w: K.fused_linear_cross_entropy(h, w, targets),
        lambda h, w: reference.fused_linear_cross_entropy(h, w, targets),
        [hidden, weight],
        torch.float32,
        atol=1e-6,
        rtol=1e-5,
    )
    # every token ignored: loss 0 and zero gradients, as the reference (mean over max(1, n_valid))
    h = torch.randn(4, 32, requires_grad=True)
    loss = K.fused_linear_cross_entropy(h, weight, torch.full((4,), -100))
    loss.backward()
    assert loss.item() == 0.0 and torch.count_nonzero(h.grad) == 0
    # the gradient is computed in the forward and scaled by grad_output in the backward
    hidden, weight, targets = _ce_inputs()
    h1, h2 = hidden.clone().requires_grad_(), hidden.clone().requires_grad_()
    (3.5 * K.fused_linear_cross_entropy(h1, weight, targets, chunk_size=8)).backward()
    (3.5 * reference.fused_linear_cross_entropy(h2, weight, targets)).backward()
    torch.testing.assert_close(h1.grad, h2.grad, atol=1e-6, rtol=1e-5)  # fp32 vs fp32 reference


def test_fused_ce_rejects_bad_targets_and_default_chunk():
    hidden, weight, targets = _ce_inputs()
    if DEVICE == "cpu":  # checked on CPU only: on a GPU it would cost a host sync per call
        with pytest.raises(ValueError, match="outside"):
            K.fused_linear_cross_entropy(hidden, weight, targets.clamp(min=0) + 999)
    assert default_chunk_size(8192, 128256) == 1024  # 1024 x 128256 fp32 logits ~ 0.5 GiB
    assert default_chunk_size(10, 128256) == 10


def test_reference_chunked_path_matches_naive():
    # The CPU memory-saving path of the reference (checkpointed chunks) is the same function.
    hidden, weight, targets = _ce_inputs()
    a = _grads(lambda h, w: reference.fused_linear_cross_entropy(h, w, targets, 1e-3, chunk_size=10),
               [hidden, weight], torch.float64)  # fmt: skip
    b = _grads(lambda h, w: reference.fused_linear_cross_entropy(h, w, targets, 1e-3), [hidden, weight],
               torch.float64)  # fmt: skip
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, atol=1e-12, rtol=1e-10)  # fp64: only summation order differs


def test_dispatch_backends_and_signatures():
    assert get_ops("torch").name == "torch"
    assert get_ops("auto", "cpu").name == "torch"  # the interpreter is for tests, never picked by auto
    tri = get_ops("triton", DEVICE)
    assert tri.name == "triton"
    for op in ("rms_norm", "swiglu", "apply_rope", "attention", "fused_linear_cross_entropy"):
        want = inspect.signature(getattr(reference, op)).parameters
        got = inspect.signature(getattr(tri, op)).parameters
        assert list(got) == list(want), op
        assert [p.default for p in got.values()] == [p.default for p in want.values()], op
    with pytest.raises(ValueError, match="not one of"):
        get_ops("cuda")


def test_fused_ce_second_backward_fails_loudly():
    # The gradients are computed in the forward and scaled in place by the backward: a second
    # backward through the same graph must raise, not return doubly-scaled gradients.
    hidden, weight, targets = _ce_inputs()
    h = hidden.clone().requires_grad_()
    loss = K.fused_linear_cross_entropy(h, weight, targets, chunk_size=16)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_fused_ce_low_precision_hidden_with_fp32_weight():
    # Mixed precision without autocast: bf16 hidden, fp32 master weight. The matmuls run in bf16
    # (as autocast would), the weight gradient comes back in fp32.
    hidden, weight, targets = _ce_inputs()
    h = hidden.to(DEVICE, torch.bfloat16).requires_grad_()
    w = weight.to(DEVICE).requires_grad_()
    K.fused_linear_cross_entropy(h, w, targets, chunk_size=16).backward()
    assert h.grad.dtype == torch.bfloat16 and w.grad.dtype == torch.float32
    hr = h.detach().double().requires_grad_()
    wr = w.detach().to(torch.bfloat16).double().requires_grad_()  # the bf16-rounded weight the kernel used
    reference.fused_linear_cross_entropy(hr, wr, targets).backward()
    # tolerance: bf16 logits and bf16 gradient matmuls: 2e-2 relative to the largest gradient
    for got, want in ((h.grad, hr.grad), (w.grad, wr.grad)):
        assert (got.double() - want).abs().max() <= 2e-2 * want.abs().max()
