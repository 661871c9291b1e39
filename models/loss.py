"""Language-model loss: fused output projection + cross-entropy (+ optional z-loss).

    loss, metrics = lm_loss(model, tokens, targets, z_loss=1e-4)
    loss.backward()                    # CE + z_loss * mean(logsumexp^2)
    metrics["ce"]                      # mean cross-entropy alone (what train reports)

The [B*T, V] logits are never returned: `ops.fused_linear_cross_entropy` works on the final hidden
states and `output.weight` (on CUDA the Triton kernel never materialises them all at once).
"""

from __future__ import annotations

import torch
import torch.nn as nn


def lm_loss(
    model: nn.Module,
    tokens: torch.Tensor,
    targets: torch.Tensor,
    z_loss: float = 0.0,
    *,
    positions: torch.Tensor | None = None,
    ignore_index: int = -100,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Mean next-token loss of `model` on tokens [B, T] against targets [B, T].

    Args:
        model: a Transformer with `output` (the last pipeline stage or a whole model).
        tokens: [B, T] input ids (or hidden states [B, T, D] when the model has no tok_embeddings).
        targets: [B, T] target ids; `ignore_index` positions are excluded from every mean.
        z_loss: weight of the PaLM log-partition penalty z_loss * mean(logsumexp(logits)^2).
        positions: optional [T] absolute positions (context-parallel shards).
    Returns:
        (loss, metrics): loss = CE + z-term, the scalar to backpropagate; metrics holds detached
        scalars "ce" (mean cross-entropy alone), "z_loss" (the z-term added to it, 0 when off) and
        "num_target_tokens" (non-ignored targets). No host sync happens here.
    Cost: with z_loss > 0 the CE alone needs a second, gradient-free pass of the fused kernel
    (one extra [N, D] x [D, V] matmul), because the kernel returns CE + z-term as one number.
    """
    hidden = model.hidden_states(tokens, positions)
    # model.ops: resolved by hidden_states for the activations' device
    return fused_lm_loss(hidden, model.output.weight, targets, model.ops, z_loss, ignore_index=ignore_index)


def fused_lm_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ops,
    z_loss: float = 0.0,
    *,
    ignore_index: int = -100,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`lm_loss` from final hidden states [B, T, D] and the output weight [V, D] (see lm_loss)."""
    flat_hidden = hidden.flatten(0, 1)
    flat_targets = targets.flatten()
    loss = ops.fused_linear_cross_entropy(flat_hidden, weight, flat_targets, z_loss, ignore_index=ignore_index)
    if z_loss:
        with torch.no_grad():
            ce = ops.fused_linear_cross_entropy(
                flat_hidden.detach(),
                weight.detach(),
                flat_targets,
                0.0,
                ignore_index=ignore_index,
            )
        z_term = loss.detach() - ce
    else:
        ce = loss.detach()
        z_term = torch.zeros_like(ce)
    metrics = {
        "ce": ce.float(),
        "z_loss": z_term.float(),
        "num_target_tokens": (flat_targets != ignore_index).sum(),
    }
    return loss, metrics
