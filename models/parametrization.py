"""Parametrizations: how init, forward multipliers and per-layer AdamW learning rates scale with size.

    model.parametrization: sp | mup | completep     (models/config.py)
    model.base_d_model / base_num_layers / base_head_dim / base_d_ff   the base the hyperparameters were tuned at

`sp` is the standard parametrization: the model and optimizer are exactly what they were before
this module existed. `mup` (Yang et al. 2022, Tensor Programs V, the AdamW column) and `completep`
(Dey et al. 2025: µP plus depth-µP with the residual branch scaled by 1/L, α = 1) are written
*relative to a base shape*: at d_model == base_d_model and num_layers == base_num_layers every
multiplier below is 1 and the model equals the `sp` one, so the learning rate tuned on the base
transfers to wider (and, with completep, deeper) models. With m = d_model / base_d_model (width
multiplier) and r = num_layers / base_num_layers (depth multiplier):

  parameter                              init std                    AdamW LR         forward
  tok_embeddings (input)                 init_std                    lr               -
  hidden matrices (wq wk wv wo w1 w2 w3) init_std / sqrt(m)          lr / m           -
    (w2: m_ff = d_ff / base_d_ff in place of m: its fan-in is d_ff)
    residual outputs (wo, w2)            ... / sqrt(2 L)   (sp, mup) lr / m           -
                                         ... / sqrt(2 L_base) (completep)             branch x 1/r (completep)
  output (readout)                       0 (zero readout)            lr               logits x 1/m
  norm gains                             1                           lr               -
  attention logits                                                                    q.k x sqrt(hd_base)/hd
                                                                                      (1/d_head, = SP at base)

Why each: under Adam an update moves every coordinate by ~lr regardless of the gradient's size, so
a hidden matrix's update changes its output by ~lr x fan_in: the hidden LR must shrink as 1/m for
activations to stay O(1). The readout's update is aligned with its input, so its output grows as
d_model: the 1/m multiplier holds logits O(1), and a zero readout removes the init term that would
otherwise shrink as 1/sqrt(m) and dominate the first steps (microsoft/mup's recommendation).
Queries and keys become correlated after training, so q.k grows as d_head: 1/d_head instead of
1/sqrt(d_head). CompleteP's 1/L branch multiplier makes each block's contribution shrink with
depth so the residual stream's total update is depth-independent; at α = 1 the hidden AdamW LR's
depth factor r^(α-1) is 1, and the init of the branch outputs no longer needs the 1/sqrt(2L)
depth scaling (the multiplier does that job), so it stays at the base depth's value.

AdamW's ε and weight decay (`eps_scale`, train/optim.py; Everett et al. 2024, Dey et al. 2025).
With the 1/m readout multiplier every gradient that reaches the residual stream is scaled by 1/m,
so the per-coordinate gradient of *every* parameter (embedding, hidden, readout, gains) shrinks as
1/m; inside a completep branch it passes the 1/r multiplier too. Adam divides by sqrt(v) + ε,
and an ε that does not shrink with the gradient takes over at width (the update falls below lr):
ε is scaled by the gradient's factor, 1/m (x 1/r inside completep's blocks). torch's AdamW decays
a parameter by lr x wd per step, so a hidden matrix whose LR is divided by m would decay m times
slower at width: its group's weight decay is divided by lr_scale, which keeps lr x wd (the decay per
step, and the equilibrium norm of the weights) that of the base. Both are 1 under sp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scalelab.errors import ConfigError

PARAMETRIZATIONS = ("sp", "mup", "completep")
COMPLETEP_ALPHA = 1.0  # depth exponent: branch multiplier r^-α, hidden LR x r^(α-1); 0.5 = depth-µP
# wrappers that parallel code inserts into parameter names (activation checkpointing, compile)
_WRAPPERS = ("._checkpoint_wrapped_module", "._orig_mod", "_orig_mod.")
_RESIDUAL_OUT = ("attention.wo", "feed_forward.w2", "experts.w2")  # experts.w2: MoE routed + shared
_FFN_DOWN = "feed_forward.w2"  # the one dense hidden matrix whose fan-in is d_ff


@dataclass(frozen=True, slots=True)
class Multipliers:
    """Forward multipliers and the width/depth ratios they come from (all 1.0 under sp)."""

    width: float = 1.0  # m = d_model / base_d_model
    depth: float = 1.0  # r = num_layers / base_num_layers
    output: float = 1.0  # logits = output(h) x this
    attention: float = 1.0  # q is multiplied by this before SDPA's 1/sqrt(head_dim)
    residual: float = 1.0  # each block's attention / feed-forward output x this


def base_shape(cfg) -> tuple[int, int, int]:
    """(base_d_model, base_num_layers, base_head_dim), each defaulting (0) to the model's own."""
    return (cfg.base_d_model or cfg.d_model, cfg.base_num_layers or cfg.num_layers, cfg.base_head_dim or cfg.head_dim)


def multipliers(cfg) -> Multipliers:
    """The forward multipliers of `cfg` (a ModelConfig); see the module docstring's table."""
    if cfg.parametrization == "sp":
        return Multipliers()
    d0, l0, hd0 = base_shape(cfg)
    m, r = cfg.d_model / d0, cfg.num_layers / l0
    completep = cfg.parametrization == "completep"
    return Multipliers(
        width=m,
        depth=r,
        output=1.0 / m,
        attention=math.sqrt(hd0 / cfg.head_dim),  # x 1/sqrt(hd) in SDPA = sqrt(hd0) / hd
        residual=r**-COMPLETEP_ALPHA if completep else 1.0,
    )


def clean_name(name: str) -> str:
    """A parameter/module name as on one device (wrappers that parallel code inserted removed)."""
    for w in _WRAPPERS:
        name = name.replace(w, "")
    return name


def fan_in_mult(cfg, name: str) -> float:
    """Width multiplier of a hidden matrix's fan-in (module or parameter name): d_ff / base_d_ff for
    the feed-forward's down projection w2 (µP scales init and LR by fan-in, and a shape rule's d_ff
    need not grow in proportion to d_model), d_model / base_d_model for every other matrix."""
    d0 = base_shape(cfg)[0]
    if clean_name(name).removesuffix(".weight").endswith(_FFN_DOWN):
        return cfg.d_ff / (cfg.base_d_ff or cfg.d_ff * d0 / cfg.d_model)
    return cfg.d_model / d0


def init_std(cfg, module_name: str) -> float:
    """Init std of the weight of the module `module_name` (single-device name, e.g.
    `layers.3.attention.wo`, `output`, `tok_embeddings`, `layers.0.feed_forward.experts.w2`)."""
    std = cfg.init_std
    residual = module_name.endswith(_RESIDUAL_OUT)
    if cfg.parametrization == "sp":
        return std / math.sqrt(2 * cfg.num_layers) if residual else std
    l0 = base_shape(cfg)[1]
    if module_name == "output" and not cfg.tied_embeddings:
        return 0.0  # zero readout
    if module_name == "tok_embeddings" or module_name == "output":
        return std
    depth_layers = l0 if cfg.parametrization == "completep" else cfg.num_layers
    hidden = std / math.sqrt(fan_in_mult(cfg, module_name))
    return hidden / math.sqrt(2 * depth_layers) if residual else hidden


def lr_scale(cfg, param_name: str, ndim: int) -> float:
    """Factor on the peak LR for the parameter `param_name` (e.g. `layers.0.attention.wq.weight`)."""
    if cfg.parametrization == "sp":
        return 1.0
    name = clean_name(param_name)
    if ndim < 2 or name.startswith(("tok_embeddings.", "output.")):
        return 1.0  # input, readout and norm gains: one infinite dimension at most -> base LR
    m = multipliers(cfg)
    depth = m.depth ** (COMPLETEP_ALPHA - 1.0) if cfg.parametrization == "completep" else 1.0
    return depth / fan_in_mult(cfg, name)


def eps_scale(cfg, param_name: str) -> float:
    """Factor on AdamW's ε for `param_name`: the scale of its per-coordinate gradient (docstring)."""
    if cfg.parametrization == "sp":
        return 1.0
    m = multipliers(cfg)
    inside_block = clean_name(param_name).startswith("layers.")
    return (m.residual if inside_block else 1.0) / m.width


def validate(cfg, prefix: str = "model") -> None:
    """ConfigError naming `<prefix>.<key>` for a parametrization the model cannot use."""
    if cfg.parametrization not in PARAMETRIZATIONS:
        raise ConfigError(
            f"{prefix}.parametrization", f"{cfg.parametrization!r} is not known", f"use one of {PARAMETRIZATIONS}"
        )
    for key in ("base_d_model", "base_num_layers", "base_head_dim", "base_d_ff"):
        value = getattr(cfg, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{prefix}.{key}", f"{value!r} must be an integer >= 0", "0 = the model's own size")
    if cfg.parametrization == "sp":
        return
    if cfg.family != "llama":
        raise ConfigError(
            f"{prefix}.parametrization",
            f"{cfg.parametrization} is implemented for the dense llama family, not {cfg.family!r}",
            "use parametrization: sp for MoE models",
        )
    if cfg.tied_embeddings:
        raise ConfigError(
            f"{prefix}.tied_embeddings",
            f"a tied matrix cannot be both the input (base LR, O(1) init) and the {cfg.parametrization} readout",
            "set tied_embeddings: false",
        )
