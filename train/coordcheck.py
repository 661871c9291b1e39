"""Coordinate check: does each layer's activation scale stay put as the model gets wider (or deeper)?

    result = coord_check(model_cfg, widths=[64, 128, 256, 512], depths=[2], steps=4,
                         batches=batches, optim_cfg=OptimConfig(lr=1e-2), parametrizations=["sp", "mup"])
    result.table()            # RMS per layer and width after the last step, and the log-log slope
    result.slopes[("mup", 2, "block1.ffn")]    # d log RMS / d log width after the last step

Yang et al. 2022 (Tensor Programs V) and microsoft/mup: train each width for a few steps at the
same learning rate and record the RMS of every layer's output. Under a correct µP the curves are
flat in width; under SP (and with a wrong µP: a missing LR scale, a forgotten multiplier) they
grow, the hidden layers' by ~width^1 after a few Adam steps. The slope of log RMS against log
width after the last step is the one number a test checks.

Each (parametrization, depth, width) model is `model_cfg` with d_model = width (d_ff scaled in
proportion, heads fixed so head_dim grows with width, as µP's 1/d_head assumes), num_layers =
depth, and its base shape (base_d_model / base_num_layers / base_head_dim / base_d_ff) the config's own unless
it names one. All models see the same batches and train with AdamW at a constant LR (no warmup,
no clipping: both would hide the scale of an update). After each step the RMS of every layer's
output is measured on a fixed probe batch (by default the first batch; the CLI draws a larger one),
without gradients; each model is trained from `seeds` inits and the RMS is their geometric mean.
completep at its base depth is the mup model exactly (every depth multiplier is 1), so it is
measured once and reported under both names.

Layers: `embedding`, `block{i}.attn` / `block{i}.ffn` (the branch outputs, before the residual
add and any branch multiplier), `block{i}` (the residual stream after block i), `logits`. Under
several depths, width slopes are per depth and `depth_slopes` compares the layers every depth has
(embedding, block0*, last block -> `block_last`, logits) across depths at the widest width.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from scalelab.models.config import ModelConfig
from scalelab.models.llama import build_model
from scalelab.models.loss import lm_loss
from scalelab.train.optim import build_optimizer, set_lr


def scaled_config(cfg: ModelConfig, *, d_model: int, num_layers: int, parametrization: str) -> ModelConfig:
    """`cfg` at another width/depth: d_ff in proportion (multiple of 8), heads fixed, same base shape."""
    d_ff = max(8, int(round(cfg.d_ff * d_model / cfg.d_model / 8)) * 8)
    return dataclasses.replace(
        cfg,
        d_model=d_model,
        d_ff=d_ff,
        num_layers=num_layers,
        parametrization=parametrization,
        base_d_model=cfg.base_d_model or cfg.d_model,
        base_num_layers=cfg.base_num_layers or cfg.num_layers,
        base_head_dim=cfg.base_head_dim or cfg.head_dim,
        base_d_ff=cfg.base_d_ff or cfg.d_ff,
    )


def _layer_hooks(model) -> tuple[dict[str, float], list]:
    """Forward hooks that store each layer's output RMS into the returned dict."""
    rms: dict[str, float] = {}

    def hook(name):
        def fn(_mod, _inputs, out):
            rms[name] = float(out.detach().float().pow(2).mean().sqrt())

        return fn

    handles = [model.tok_embeddings.register_forward_hook(hook("embedding"))]
    for i, block in model.layers.items():
        handles.append(block.attention.register_forward_hook(hook(f"block{i}.attn")))
        handles.append(block.feed_forward.register_forward_hook(hook(f"block{i}.ffn")))
        handles.append(block.register_forward_hook(hook(f"block{i}")))
    handles.append(model.output.register_forward_hook(hook("logits")))
    return rms, handles


def measure(
    cfg: ModelConfig, batches: list[torch.Tensor], optim_cfg, *, seed: int, probe: torch.Tensor | None = None
) -> list[dict[str, float]]:
    """RMS of every layer on `probe` [B, T] (default: the first batch's inputs) after each of
    len(batches) AdamW steps (one dict per step)."""
    model = build_model(cfg, seed=seed)
    opt = build_optimizer(model, optim_cfg, "cpu")
    set_lr(opt, optim_cfg.lr)
    probe = batches[0][:, :-1] if probe is None else probe
    rms, handles = _layer_hooks(model)
    out = []
    for batch in batches:
        loss, _ = lm_loss(model, batch[:, :-1], batch[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            model(probe)
        out.append(dict(rms))
    for h in handles:
        h.remove()
    return out


def loglog_slope(x: list[float], y: list[float]) -> float:
    """Least-squares slope of log y on log x."""
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


@dataclass(kw_only=True)
class CoordCheck:
    widths: list[int]
    depths: list[int]
    steps: int
    lr: float
    seeds: int
    # (parametrization, depth, width) -> per step (1..steps) {layer: RMS}
    rms: dict[tuple[str, int, int], list[dict[str, float]]]
    slopes: dict[tuple[str, int, str], float] = field(default_factory=dict)  # width slope after the last step
    depth_slopes: dict[tuple[str, str], float] = field(default_factory=dict)  # at the widest width

    @property
    def parametrizations(self) -> list[str]:
        return list(dict.fromkeys(p for p, _, _ in self.rms))

    def layers(self, depth: int) -> list[str]:
        any_key = next(k for k in self.rms if k[1] == depth)
        return list(self.rms[any_key][-1])

    def rows(self) -> list[dict]:
        """Every measurement as a flat row (parametrization, depth, width, step, layer, rms)."""
        return [
            dict(parametrization=p, depth=d, width=w, step=t + 1, layer=layer, rms=v)
            for (p, d, w), per_step in self.rms.items()
            for t, values in enumerate(per_step)
            for layer, v in values.items()
        ]

    def table(self) -> str:
        """RMS after the last step per layer and width, with the width slope (and depth slopes)."""
        lines = []
        for p in self.parametrizations:
            for d in self.depths:
                lines.append(
                    f"{p}, {d} layers: RMS after step {self.steps} "
                    f"(lr {self.lr:g}, geometric mean over {self.seeds} inits)"
                )
                lines.append(f"  {'layer':<12}" + "".join(f"{w:>10}" for w in self.widths) + f"{'slope':>8}")
                for layer in self.layers(d):
                    vals = "".join(f"{self.rms[(p, d, w)][-1][layer]:>10.3g}" for w in self.widths)
                    lines.append(f"  {layer:<12}{vals}{self.slopes[(p, d, layer)]:>+8.2f}")
                lines.append(f"  max |slope| {self.max_abs_slope_at(p, d):.2f}")
            if len(self.depths) > 1:
                ds = ", ".join(f"{k} {v:+.2f}" for (q, k), v in self.depth_slopes.items() if q == p)
                lines.append(f"{p}: depth slopes at width {self.widths[-1]} (log RMS vs log depth): {ds}")
        return "\n".join(lines)

    def max_abs_slope_at(self, parametrization: str, depth: int) -> float:
        return max(abs(s) for (p, d, _), s in self.slopes.items() if p == parametrization and d == depth)


def coord_check(
    model_cfg: ModelConfig,
    *,
    widths: list[int],
    depths: list[int] | None = None,
    steps: int = 4,
    batches: list[torch.Tensor],
    optim_cfg,
    parametrizations: list[str] | None = None,
    seeds: int = 3,
    probe: torch.Tensor | None = None,
) -> CoordCheck:
    """Train every (parametrization, depth, width) for `steps` steps and measure (module docstring).

    batches: at least `steps` token batches [B, T + 1] (the first is also the probe batch).
    optim_cfg: an OptimConfig; its lr is the constant LR, grad_clip is ignored.
    seeds: inits per model (seed 0..seeds-1); RMS is their geometric mean. One init's RMS wanders by
        ~±30% from width to width at these sizes, which is what the slope of a few widths picks up.
    probe: token ids [B, T] the RMS is measured on (default: the first batch's inputs).
    """
    depths = depths or [model_cfg.num_layers]
    parametrizations = parametrizations or [model_cfg.parametrization]
    if len(batches) < steps:
        raise ValueError(f"{len(batches)} batches for {steps} steps")
    rms, measured = {}, {}
    for p in parametrizations:
        for d in depths:
            for w in widths:
                cfg = scaled_config(model_cfg, d_model=w, num_layers=d, parametrization=p)
                if p == "completep" and cfg.num_layers == cfg.base_num_layers:
                    cfg = dataclasses.replace(cfg, parametrization="mup")  # the same model (docstring)
                key = repr(cfg)  # ModelConfig is mutable, so not hashable
                if key not in measured:
                    runs = [measure(cfg, batches[:steps], optim_cfg, seed=s, probe=probe) for s in range(seeds)]
                    measured[key] = [
                        {k: math.exp(sum(math.log(r[t][k]) for r in runs) / seeds) for k in runs[0][t]}
                        for t in range(steps)
                    ]
                rms[(p, d, w)] = measured[key]
    result = CoordCheck(widths=list(widths), depths=list(depths), steps=steps, lr=optim_cfg.lr, seeds=seeds, rms=rms)
    for p in parametrizations:
        for d in depths:
            for layer in result.layers(d):
                ys = [rms[(p, d, w)][-1][layer] for w in widths]
                result.slopes[(p, d, layer)] = loglog_slope(widths, ys) if len(widths) > 1 else math.nan
        if len(depths) > 1:
            w = widths[-1]
            for layer in ("embedding", "block0.attn", "block0.ffn", "block_last", "logits"):
                ys = [rms[(p, d, w)][-1][f"block{d - 1}" if layer == "block_last" else layer] for d in depths]
                result.depth_slopes[(p, layer)] = loglog_slope(depths, ys)
    return result
