"""AdamW with decoupled weight decay applied only to matrices (not norms, biases or embeddings).

Excluding embeddings and norm gains from decay follows common LLM practice (nanoGPT decays every
2-D tensor; Llama-style recipes exclude embeddings too: a decayed embedding shrinks rare tokens).
"""

from __future__ import annotations

import torch


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        is_embedding = "tok_embeddings" in name
        (decay if p.ndim >= 2 and not is_embedding else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(model: torch.nn.Module, optim_cfg, device_type: str = "cpu") -> torch.optim.AdamW:
    """torch AdamW (foreach on CPU, fused on CUDA); the lr is set each step by the schedule."""
    kwargs = dict(lr=optim_cfg.lr, betas=(optim_cfg.beta1, optim_cfg.beta2), eps=optim_cfg.eps)
    if device_type == "cuda":
        kwargs["fused"] = True
    return torch.optim.AdamW(param_groups(model, optim_cfg.weight_decay), **kwargs)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
