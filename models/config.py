"""ModelConfig: the architecture of one model (sizes, RoPE, norms, init, kernel backend).

One flat, typed dataclass that YAML/`--set model.x=...` overrides map onto. `validate()` checks it
and raises `ConfigError("model.<key>", problem, fix)` for anything the model code cannot build.

    cfg = ModelConfig(vocab_size=320, num_layers=2, d_model=64, num_heads=4, num_kv_heads=2,
                      d_ff=192, max_seq_len=128)
    cfg.validate()          # raises ConfigError on bad input
    cfg.head_dim            # 16

`family` names the block type: "llama" (dense pre-norm RMSNorm / RoPE / GQA / SwiGLU) or "moe" (the
same with the SwiGLU replaced by a mixture of experts, `scalelab.models.moe`). The MoE fields come
after the dense ones and are ignored by the dense family.
"""

from __future__ import annotations

from dataclasses import dataclass

from scalelab.errors import ConfigError
from scalelab.kernels import BACKENDS
from scalelab.models import parametrization

FAMILIES = ("llama", "moe")
MLPS = ("swiglu", "gelu")  # the dense feed-forward: gated SiLU (3 matrices) or a GELU MLP (2 matrices)
ROUTER_GATINGS = ("softmax", "sigmoid")
EXPERT_METHODS = ("loop", "grouped")


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    family: str = "llama"  # block type; see FAMILIES
    vocab_size: int  # embedding rows (the tokenizer's vocabulary, usually padded to a multiple of 64)
    num_layers: int  # transformer blocks
    d_model: int  # residual-stream width
    num_heads: int  # query heads; head_dim = d_model // num_heads
    num_kv_heads: int  # key/value heads (GQA); == num_heads is plain multi-head attention
    d_ff: int  # feed-forward hidden width (w1 (and SwiGLU's w3) output, w2 input)
    max_seq_len: int  # length of the RoPE tables; longest sequence the model accepts
    rope_theta: float = 10000.0  # RoPE base (Llama 2: 1e4, Llama 3: 5e5)
    norm_eps: float = 1e-5  # RMSNorm epsilon
    tied_embeddings: bool = False  # output projection shares the input embedding matrix
    qk_norm: bool = False  # RMSNorm over head_dim on q and k before RoPE (OLMo-2 / Qwen-3 style)
    # The dense feed-forward (see MLPS): "gelu" is w2(gelu(w1 x)), GPT-2's MLP; the shape rule gives it
    # 3/2 the SwiGLU width (~4 d), the parameters and FLOPs of SwiGLU's three matrices
    mlp: str = "swiglu"
    # Init (see Transformer.init_weights): every matrix, embeddings included, ~ N(0, init_std);
    # the residual output projections (attention.wo, feed_forward.w2) are further scaled by
    # 1/sqrt(2 * num_layers) (GPT-2 / Megatron); norm weights = 1.
    init_std: float = 0.02
    kernels: str = "auto"  # 'auto' (Triton on CUDA, torch elsewhere) | 'triton' | 'torch'
    # Hyperparameter transfer (scalelab.models.parametrization): sp | mup | completep. Under mup /
    # completep, init, forward multipliers and per-layer LRs are relative to the base shape below
    # (0 = the model's own: every multiplier 1); tune the LR at the base, use it at every size.
    parametrization: str = "sp"
    base_d_model: int = 0  # width the base hyperparameters were tuned at
    base_num_layers: int = 0  # depth of the base (completep scales the residual branches by base/L)
    base_head_dim: int = 0  # head_dim of the base (attention logits x sqrt(base_head_dim) / head_dim)
    base_d_ff: int = 0  # d_ff of the base (w2's fan-in); 0 = d_ff x base_d_model / d_model (in proportion)
    # --- MoE (family "moe"; see scalelab.models.moe) ---
    num_experts: int = 8  # routed experts per MoE layer
    num_experts_per_tok: int = 2  # top-k experts each token is sent to
    moe_d_ff: int = 0  # hidden width of one expert; 0 = d_ff (smaller = fine-grained experts)
    num_shared_experts: int = 0  # always-active experts of width moe_d_ff (DeepSeek-MoE style)
    router_gating: str = "softmax"  # softmax | sigmoid (top-k sigmoid scores renormalised)
    router_aux_loss_weight: float = 0.01  # load-balancing loss weight (0 = off)
    router_z_loss_weight: float = 0.001  # router z-loss weight (0 = off)
    capacity_factor: float = 0.0  # 0 = dropless; c > 0: each expert takes <= ceil(c*N*k/E) copies
    moe_expert_method: str = "loop"  # loop (reference) | grouped (batched GEMM / torch._grouped_mm)

    @property
    def expert_d_ff(self) -> int:
        """Hidden width of one routed expert (moe_d_ff, or d_ff when 0)."""
        return self.moe_d_ff or self.d_ff

    @property
    def head_dim(self) -> int:
        """Width of one attention head (d_model // num_heads)."""
        return self.d_model // self.num_heads

    def validate(self, prefix: str = "model") -> None:
        """Raise ConfigError naming `<prefix>.<key>` for the first invalid field."""
        if self.family not in FAMILIES:
            raise ConfigError(f"{prefix}.family", f"{self.family!r} is not a known family", f"use one of {FAMILIES}")
        for key in (
            "vocab_size",
            "num_layers",
            "d_model",
            "num_heads",
            "num_kv_heads",
            "d_ff",
            "max_seq_len",
        ):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{prefix}.{key}", f"{value!r} must be a positive integer", "set it > 0")
        for key in ("rope_theta", "norm_eps", "init_std"):
            value = getattr(self, key)
            if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
                raise ConfigError(f"{prefix}.{key}", f"{value!r} must be a positive number", "set it > 0")
        if self.d_model % self.num_heads:
            raise ConfigError(
                f"{prefix}.num_heads",
                f"{self.num_heads} does not divide d_model={self.d_model}",
                "pick num_heads dividing d_model (head_dim = d_model / num_heads)",
            )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"{prefix}.num_kv_heads",
                f"{self.num_kv_heads} does not divide num_heads={self.num_heads}",
                "pick num_kv_heads dividing num_heads (GQA groups must be equal)",
            )
        if self.head_dim % 2:
            raise ConfigError(
                f"{prefix}.num_heads",
                f"head_dim = d_model / num_heads = {self.head_dim} is odd; RoPE rotates pairs",
                "pick num_heads so that d_model / num_heads is even",
            )
        parametrization.validate(self, prefix)
        if self.kernels not in BACKENDS:
            raise ConfigError(f"{prefix}.kernels", f"{self.kernels!r} is not a backend", f"use one of {BACKENDS}")
        if self.mlp not in MLPS:
            raise ConfigError(f"{prefix}.mlp", f"{self.mlp!r} is not a feed-forward", f"use one of {MLPS}")
        if self.family == "moe":
            if self.mlp != "swiglu":
                raise ConfigError(f"{prefix}.mlp", f"{self.mlp!r}: MoE experts are SwiGLU", "use mlp: swiglu")
            self._validate_moe(prefix)

    def _validate_moe(self, prefix: str) -> None:
        for key in ("num_experts", "num_experts_per_tok"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{prefix}.{key}", f"{value!r} must be a positive integer", "set it > 0")
        if self.num_experts_per_tok > self.num_experts:
            raise ConfigError(
                f"{prefix}.num_experts_per_tok",
                f"{self.num_experts_per_tok} > num_experts={self.num_experts}",
                "pick top-k <= num_experts",
            )
        for key in ("moe_d_ff", "num_shared_experts"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{prefix}.{key}", f"{value!r} must be an integer >= 0", "use 0 to disable it")
        for key in ("router_aux_loss_weight", "router_z_loss_weight", "capacity_factor"):
            value = getattr(self, key)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{prefix}.{key}", f"{value!r} must be a number >= 0", "use 0 to disable it")
        if self.router_gating not in ROUTER_GATINGS:
            raise ConfigError(
                f"{prefix}.router_gating", f"{self.router_gating!r} unknown", f"use one of {ROUTER_GATINGS}"
            )
        if self.moe_expert_method not in EXPERT_METHODS:
            raise ConfigError(
                f"{prefix}.moe_expert_method", f"{self.moe_expert_method!r} unknown", f"use one of {EXPERT_METHODS}"
            )
