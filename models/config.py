"""ModelConfig: the architecture of one model (sizes, RoPE, norms, init, kernel backend).

One flat, typed dataclass that YAML/`--set model.x=...` overrides map onto. `validate()` checks it
and raises `ConfigError("model.<key>", problem, fix)` for anything the model code cannot build.

    cfg = ModelConfig(vocab_size=320, num_layers=2, d_model=64, num_heads=4, num_kv_heads=2,
                      d_ff=192, max_seq_len=128)
    cfg.validate()          # raises ConfigError on bad input
    cfg.head_dim            # 16

`family` names the block type. Only "llama" (dense pre-norm RMSNorm / RoPE / GQA / SwiGLU) exists
now; another family (MoE) adds its own fields after the dense ones and its checks to `validate`.
"""

from __future__ import annotations

from dataclasses import dataclass

from scalelab.errors import ConfigError

FAMILIES = ("llama",)


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    family: str = "llama"  # block type; see FAMILIES
    vocab_size: int  # embedding rows (the tokenizer's vocabulary, usually padded to a multiple of 64)
    num_layers: int  # transformer blocks
    d_model: int  # residual-stream width
    num_heads: int  # query heads; head_dim = d_model // num_heads
    num_kv_heads: int  # key/value heads (GQA); == num_heads is plain multi-head attention
    d_ff: int  # SwiGLU hidden width (w1/w3 output, w2 input)
    max_seq_len: int  # length of the RoPE tables; longest sequence the model accepts
    rope_theta: float = 10000.0  # RoPE base (Llama 2: 1e4, Llama 3: 5e5)
    norm_eps: float = 1e-5  # RMSNorm epsilon
    tied_embeddings: bool = False  # output projection shares the input embedding matrix
    qk_norm: bool = False  # RMSNorm over head_dim on q and k before RoPE (OLMo-2 / Qwen-3 style)
    # Init (see Transformer.init_weights): every matrix, embeddings included, ~ N(0, init_std);
    # the residual output projections (attention.wo, feed_forward.w2) are further scaled by
    # 1/sqrt(2 * num_layers) (GPT-2 / Megatron); norm weights = 1.
    init_std: float = 0.02
    kernels: str = "auto"  # 'auto' (Triton on CUDA, torch elsewhere) | 'triton' | 'torch'

    @property
    def head_dim(self) -> int:
        """Width of one attention head (d_model // num_heads)."""
        return self.d_model // self.num_heads

    def validate(self, prefix: str = "model") -> None:
        """Raise ConfigError naming `<prefix>.<key>` for the first invalid field."""
        from scalelab.kernels import BACKENDS  # imported here: keeps config importable on its own

        if self.family not in FAMILIES:
            raise ConfigError(
                f"{prefix}.family", f"{self.family!r} is not a known family", f"use one of {FAMILIES}"
            )
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
        if self.kernels not in BACKENDS:
            raise ConfigError(
                f"{prefix}.kernels", f"{self.kernels!r} is not a backend", f"use one of {BACKENDS}"
            )
