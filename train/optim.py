"""AdamW with decoupled weight decay applied only to matrices (not norms, biases or embeddings).

Excluding embeddings and norm gains from decay follows common LLM practice (nanoGPT decays every
2-D tensor; Llama-style recipes exclude embeddings too: a decayed embedding shrinks rare tokens).

Under `model.parametrization: mup | completep` the groups are further split by the per-parameter
factors of scalelab.models.parametrization: the LR's (hidden matrices: 1 / width multiplier), each
group keeping it as `lr_scale` so that `set_lr` sets `lr = peak-schedule lr x lr_scale`; ε's
(`eps_scale`: the gradient's scale, 1 / width multiplier); and the weight decay's (1 / lr_scale, so
a decayed group's lr x weight_decay, torch's decay per step, is the base's at every width). Groups are
built from parameter names, which FSDP2 / TP / pipeline chunks keep as on one device, so the same
parameter gets the same LR under every layout. Under `sp` the groups are exactly the two above.
"""

from __future__ import annotations

import torch

from scalelab.models import parametrization
from scalelab.models.config import ModelConfig


def model_config_of(model: torch.nn.Module) -> ModelConfig | None:
    """The ModelConfig of a Transformer, or of the first chunk of a pipeline's ModelParts."""
    cfg = getattr(model, "cfg", None)
    if isinstance(cfg, ModelConfig):
        return cfg
    chunks = getattr(model, "chunks", None) or []
    return next((c.cfg for c in chunks if isinstance(getattr(c, "cfg", None), ModelConfig)), None)


def param_groups(model: torch.nn.Module, weight_decay: float, model_cfg: ModelConfig | None = None) -> list[dict]:
    """AdamW groups: (weight decay or not) x (LR factor, ε factor of the parametrization).

    Under mup/completep each group carries `lr_scale` and `eps_scale`, and a decayed group's
    weight_decay is already divided by its lr_scale (module docstring)."""
    model_cfg = model_cfg or model_config_of(model)
    groups: dict[tuple[bool, float, float], list] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        is_embedding = "tok_embeddings" in name
        decay = p.ndim >= 2 and not is_embedding
        scales = (1.0, 1.0)
        if model_cfg is not None:
            scales = (parametrization.lr_scale(model_cfg, name, p.ndim), parametrization.eps_scale(model_cfg, name))
        groups.setdefault((decay, *scales), []).append(p)
    if all(key[1:] == (1.0, 1.0) for key in groups):  # sp: the plain two groups, decay first
        out = [{"params": groups.get((True, 1.0, 1.0), []), "weight_decay": weight_decay}]
        if (False, 1.0, 1.0) in groups:
            out.append({"params": groups[(False, 1.0, 1.0)], "weight_decay": 0.0})
        return out
    return [
        {"params": ps, "weight_decay": weight_decay / lr if decay else 0.0, "lr_scale": lr, "eps_scale": eps}
        for (decay, lr, eps), ps in sorted(groups.items(), key=lambda kv: (not kv[0][0], kv[0][1], kv[0][2]))
    ]


def build_optimizer(
    model: torch.nn.Module, optim_cfg, device_type: str = "cpu", model_cfg: ModelConfig | None = None
) -> torch.optim.AdamW:
    """torch AdamW (foreach on CPU, fused on CUDA); the lr is set each step by the schedule (set_lr).

    model_cfg: the parametrization's source; default: found on the model (model_config_of)."""
    kwargs = dict(lr=optim_cfg.lr, betas=(optim_cfg.beta1, optim_cfg.beta2), eps=optim_cfg.eps)
    if device_type == "cuda":
        kwargs["fused"] = True
    groups = param_groups(model, optim_cfg.weight_decay, model_cfg)
    for g in groups:
        if "lr_scale" in g:
            g["lr"] = optim_cfg.lr * g["lr_scale"]
            g["eps"] = optim_cfg.eps * g["eps_scale"]
    return torch.optim.AdamW(groups, **kwargs)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set every group's LR to `lr` times its parametrization factor (`lr_scale`, 1 under sp)."""
    for group in optimizer.param_groups:
        scale = group.get("lr_scale")
        group["lr"] = lr if scale is None else lr * scale
