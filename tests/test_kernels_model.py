"""The debug-size Llama trains with `kernels: triton` (Triton interpreter on CPU) exactly like `torch`.

Both models start from the same seed and take SGD steps on the same batch; every step's loss (CE + z-loss,
through the fused linear cross-entropy) and the first step's parameter gradients must match the
torch-reference model. Tolerances, fp32: losses within atol 2e-5 / rtol 1e-5 at every step (measured
differences ~1e-7), first-step gradients within atol 1e-5 / rtol 1e-4. Plain SGD keeps any kernel
difference proportional (Adam would amplify sign noise in near-zero gradients).
"""

import os

import pytest
import torch  # importing torch does not import triton

if not torch.cuda.is_available():  # CPU: the Triton interpreter, set before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA and TRITON_INTERPRET is not 1", allow_module_level=True)

from scalelab.kernels.attention import _attn_fwd  # noqa: E402
from scalelab.models.llama import build_model  # noqa: E402
from scalelab.models.loss import lm_loss  # noqa: E402
from scalelab.models.presets import get_preset  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and type(_attn_fwd).__name__ != "InterpretedFunction":
    # The interpreter is chosen when a kernel module is imported; here it was imported earlier.
    pytest.skip("scalelab.kernels was imported before TRITON_INTERPRET=1 was set", allow_module_level=True)
NUM_STEPS = 3


def _train(kernels: str, batches):
    cfg = get_preset("debug", kernels=kernels)
    model = build_model(cfg, DEVICE, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    losses, first_grads = [], None
    for tokens, targets in batches:
        loss, _ = lm_loss(model, tokens, targets, z_loss=1e-4)
        loss.backward()
        if first_grads is None:
            first_grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return model.ops.name, losses, first_grads


def test_debug_model_trains_the_same_with_triton_kernels():
    vocab = get_preset("debug").vocab_size
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, vocab, (2, 22), generator=g)  # T = 21: ragged vs the 16/32 blocks
    targets = seq[:, 1:].clone()
    targets[0, :5] = -100  # some ignored positions
    # One batch, seen NUM_STEPS times: the loss must fall step after step.
    batches = [(seq[:, :-1].to(DEVICE), targets.to(DEVICE))] * NUM_STEPS
    name_t, losses_t, grads_t = _train("triton", batches)
    name_r, losses_r, grads_r = _train("torch", batches)
    assert (name_t, name_r) == ("triton", "torch")
    assert losses_r[2] < losses_r[1] < losses_r[0]  # it does train
    # tolerance: losses within atol 2e-5, rtol 1e-5 at every step
    torch.testing.assert_close(torch.tensor(losses_t), torch.tensor(losses_r), atol=2e-5, rtol=1e-5)
    for name, grad in grads_r.items():
        # tolerance: first-step gradients within atol 1e-5, rtol 1e-4
        torch.testing.assert_close(grads_t[name], grad, atol=1e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
