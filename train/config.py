"""The run config tree: everything one pretraining run needs, typed, from YAML plus overrides.

    model:     architecture (a preset name, a target parameter count, or explicit fields)
    data:      tokenizer, sources with mixture weights, sequence length
    optim:     AdamW hyperparameters and gradient clipping
    schedule:  learning-rate schedule over the run's tokens (cosine | wsd | constant)
    train:     run length in tokens, global batch in tokens, micro-batching, seed, device, dtype
    eval:      validation interval and size
    checkpoint: interval and how many to keep
    logging:   metrics cadence, wandb mode, progress bar
    parallel:  the layout (see scalelab.parallel.config)
    profile:   optimizer steps to profile with torch.profiler (scalelab.train.profiling)

`load_run_config(path, overrides)` returns a validated `RunConfig`; every bad key or value raises
`ConfigError` naming the key path before any process starts. `to_dict(cfg)` is what gets saved as
`config.json` beside the run's records, and `load_run_config` reads that back identically. A run's
id and the question "is this the same run?" are scalelab.train.identity's.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from scalelab.config_tree import apply_overrides, from_dict, load_yaml, to_dict
from scalelab.errors import ConfigError
from scalelab.models.config import ModelConfig
from scalelab.models.presets import get_preset
from scalelab.models.shapes import shape_for_params
from scalelab.parallel.config import ParallelConfig
from scalelab.parallel.dims import ParallelDims
from scalelab.train.data.config import DataConfig
from scalelab.train.data.tokenizer import load_tokenizer
from scalelab.train.eval_tasks import load_tasks

SCHEDULES = ("cosine", "wsd", "constant")


@dataclass(kw_only=True, slots=True)
class OptimConfig:
    lr: float = 3e-3  # peak learning rate
    weight_decay: float = 0.1  # decoupled (AdamW); not applied to norms, biases or embeddings
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    z_loss: float = 0.0  # weight of the log-partition penalty (PaLM); 1e-4 is a common choice


@dataclass(kw_only=True, slots=True)
class ScheduleConfig:
    name: str = "cosine"  # cosine | wsd | constant
    warmup_tokens: int = 0  # linear warmup length in tokens (absolute, so WSD branches share it)
    warmup_fraction: float = 0.05  # used when warmup_tokens == 0: fraction of the run
    decay_fraction: float = 0.2  # wsd: final fraction of the run spent decaying
    decay_shape: str = "linear"  # wsd decay: linear | sqrt (1 - sqrt) | cosine
    min_lr_ratio: float = 0.1  # final lr = min_lr_ratio * lr (cosine and wsd)


@dataclass(kw_only=True, slots=True)
class TrainLoopConfig:
    num_tokens: int = 2_000_000  # run length in tokens (rounded down to whole steps)
    global_batch_tokens: int = 8192  # tokens per optimizer step across all data-parallel ranks
    micro_batch_sequences: int = 0  # sequences per forward/backward on one rank; 0 = no accumulation
    seed: int = 0  # drives init and dropout, and the data order unless data_seed is set
    # the data order's own seed (None: `seed`), so a design can replicate a point by init or by data
    # order alone; left out of the run's identity while None (scalelab.train.identity)
    data_seed: int | None = None
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto (bf16 autocast on CUDA, fp32 on CPU) | fp32 | bf16
    init_from: str | None = None  # checkpoint dir to start from (e.g. a WSD branch off a stable run)
    max_loss_spike: float = 0.0  # diverged when loss > this × best loss so far (after warmup); 0 = off
    num_threads: int = 0  # torch intra-op threads per process; 0 = torch's default


@dataclass(kw_only=True, slots=True)
class EvalConfig:
    interval_steps: int = 50  # validation every this many steps (and at the end); 0 = only at the end
    val_batch_sequences: int = 16
    # Multiple-choice tasks scored at every eval step (acc, acc_norm, bpb of the correct answer):
    # "bundled:stdlib_nextline", a JSONL path, or "olmes:arc_easy" (see scalelab.train.eval_tasks).
    tasks: list[str] = field(default_factory=list)
    task_limit: int = 0  # examples per task; 0 = all


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    interval_steps: int = 100  # DCP checkpoint every this many steps (and at the end); 0 = only the end
    keep_last: int = 2  # older checkpoints are deleted once a newer one is complete
    final: bool = True  # always save a checkpoint at the end of the run


@dataclass(kw_only=True, slots=True)
class LoggingConfig:
    interval_steps: int = 1  # metrics row every this many steps
    wandb: str = "offline"  # offline | disabled | online
    wandb_project: str = "scalelab"
    progress: str = "auto"  # auto (when stderr is a terminal) | on | off


@dataclass(kw_only=True, slots=True)
class ProfileConfig:
    # Optimizer steps (1-based) to record with torch.profiler; each gets a time/memory summary per
    # rank in <run_dir>/profile/ (scalelab.train.profiling). Empty = off; steps past the end of a
    # run are skipped (one list serves a sweep's runs of every length). Skip the first steps: they
    # include one-off warm-up (allocator growth, compile, lazy FSDP init).
    steps: list[int] = field(default_factory=list)
    memory: bool = True  # record allocations (peak memory by category; slower traces)


@dataclass(kw_only=True, slots=True)
class RunConfig:
    name: str = "run"
    model: ModelConfig
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    tags: dict[str, str] = field(default_factory=dict)  # free-form labels carried into the store

    # --- derived quantities (units in the names) ---------------------------------------------
    @property
    def seq_len(self) -> int:
        return self.data.seq_len

    @property
    def global_batch_sequences(self) -> int:
        return self.train.global_batch_tokens // self.data.seq_len

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_sequences * self.data.seq_len

    @property
    def num_steps(self) -> int:
        return self.train.num_tokens // self.tokens_per_step

    @property
    def data_order_seed(self) -> int:
        """The seed of the data order: train.data_seed, or train.seed when it is not set."""
        return self.train.seed if self.train.data_seed is None else self.train.data_seed

    @property
    def warmup_tokens(self) -> int:
        s = self.schedule
        return s.warmup_tokens if s.warmup_tokens > 0 else int(s.warmup_fraction * self.train.num_tokens)


def _expand_model_section(model: dict[str, Any]) -> dict[str, Any]:
    """`preset:` or `target_params:` become full ModelConfig fields; explicit keys override them."""
    model = dict(model)
    preset = model.pop("preset", None)
    target = model.pop("target_params", None)
    if preset is not None and target is not None:
        raise ConfigError("model.preset", "given together with model.target_params", "set only one of them")
    base: dict[str, Any] = {}
    if preset is not None:
        base = to_dict(get_preset(str(preset)))
    elif target is not None:
        try:
            target = float(target)
        except (TypeError, ValueError):
            raise ConfigError("model.target_params", f"{target!r} is not a number", "e.g. 1e7") from None
        if target <= 0:
            raise ConfigError("model.target_params", f"{target} must be > 0", "e.g. 1e7")
        vocab = model.get("vocab_size") or 320
        mlp = {"mlp": model["mlp"]} if "mlp" in model else {}  # its d_ff (and so the count) depends on it
        base = to_dict(shape_for_params(target, vocab_size=int(vocab), **mlp))
    base.update(model)
    return base


def padded_vocab_size(tokenizer_vocab: int, multiple: int = 64) -> int:
    """Embedding rows: the tokenizer's vocabulary rounded up to a multiple of 64 (matmul-friendly)."""
    return -(-tokenizer_vocab // multiple) * multiple


def merge_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """The given plain tree with every default section filled in (model and tags stay as given)."""
    defaults = {
        name: to_dict(f.default_factory())
        for name, f in RunConfig.__dataclass_fields__.items()
        if name not in ("model", "tags") and callable(getattr(f, "default_factory", None))
    }
    return _deep_merge(defaults, data)


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def build_run_config(data: dict[str, Any], overrides: list[str] | None = None) -> RunConfig:
    """Validate a plain dict (+ overrides) into a RunConfig; ConfigError names the bad key."""
    # Overrides may index into defaults the YAML left out (data.sources.0.weight), so the
    # overrides apply to the defaults merged with the given tree; the model section stays raw
    # because a preset or target size is expanded after the overrides.
    data = merge_defaults(json.loads(json.dumps(data)))
    data = apply_overrides(data, overrides or [])
    unknown_top = set(data) - {f for f in RunConfig.__dataclass_fields__}
    if unknown_top:
        from_dict(RunConfig, {k: data[k] for k in unknown_top} | {"model": {}})  # raises with a hint
    model = data.get("model")
    if not isinstance(model, dict):
        raise ConfigError("model", "section missing", "add model: {preset: debug} or explicit sizes")
    data["model"] = _expand_model_section(model)
    # explicit sizes without a RoPE length: the model is built for the sequences it trains on
    if isinstance(data.get("data"), dict):
        data["model"].setdefault("max_seq_len", data["data"].get("seq_len"))
    _switches_as_words(data)
    explicit_vocab = "vocab_size" in model
    if not explicit_vocab:
        data["model"].setdefault("vocab_size", 1)  # placeholder, replaced from the tokenizer below
    cfg = from_dict(RunConfig, data)
    for src in cfg.data.sources:
        # Relative data paths are resolved here, once: Ray trials and spawned ranks run elsewhere.
        if src.path != "default" and not os.path.isabs(src.path) and os.path.exists(src.path):
            src.path = os.path.abspath(src.path)
    if not explicit_vocab:
        cfg.model.vocab_size = padded_vocab_size(load_tokenizer(cfg.data.tokenizer).vocab_size)
    validate_run_config(cfg)
    return cfg


def _switches_as_words(data: dict[str, Any]) -> None:
    """YAML 1.1 reads `on`/`off` (and yes/no) as booleans: `logging: {progress: off}` means "off"."""
    section = data.get("logging")
    if isinstance(section, dict) and isinstance(section.get("progress"), bool):
        section["progress"] = "on" if section["progress"] else "off"


def load_run_config(path: str, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML (or JSON) run config file and apply dotted overrides."""
    return build_run_config(load_yaml(path), overrides)


def _check_finite(node: Any, key: str) -> None:
    """NaN or infinity in any number of the tree (`--set optim.lr=nan`) is a ConfigError naming it."""
    if dataclasses.is_dataclass(node):
        for f in dataclasses.fields(node):
            _check_finite(getattr(node, f.name), f"{key}.{f.name}" if key else f.name)
    elif isinstance(node, list | tuple):
        for i, v in enumerate(node):
            _check_finite(v, f"{key}.{i}")
    elif isinstance(node, dict):
        for k, v in node.items():
            _check_finite(v, f"{key}.{k}")
    elif isinstance(node, float) and not math.isfinite(node):
        raise ConfigError(key, f"{node} is not a finite number", "give a finite value")


def validate_run_config(cfg: RunConfig) -> None:
    """Cross-field checks; each raises ConfigError with the key path and the fix.

    One piece: a flat list of independent checks in the order of the config's sections, each a few
    lines; split, it would be many one-check functions called in the same order."""
    _check_finite(cfg, "")
    # the degrees first: the batch arithmetic below divides by them
    ParallelDims.from_config(cfg.parallel, world_size=cfg.parallel.world_size)
    cfg.model.validate("model")
    cfg.data.validate("data")
    tok_vocab = load_tokenizer(cfg.data.tokenizer).vocab_size
    if cfg.model.vocab_size < tok_vocab:
        raise ConfigError(
            "model.vocab_size",
            f"{cfg.model.vocab_size} < tokenizer vocabulary {tok_vocab}",
            "remove model.vocab_size to take it from the tokenizer",
        )
    if cfg.data.seq_len > cfg.model.max_seq_len:
        raise ConfigError(
            "data.seq_len",
            f"{cfg.data.seq_len} exceeds model.max_seq_len={cfg.model.max_seq_len}",
            "lower data.seq_len or raise model.max_seq_len",
        )
    t, o, s = cfg.train, cfg.optim, cfg.schedule
    dp = cfg.parallel.dp_replicate * cfg.parallel.dp_shard
    if t.global_batch_tokens < cfg.data.seq_len or t.global_batch_tokens % (cfg.data.seq_len * dp):
        raise ConfigError(
            "train.global_batch_tokens",
            f"{t.global_batch_tokens} is not a whole number of sequences of data.seq_len={cfg.data.seq_len}"
            + (f" per data-parallel rank (dp_replicate*dp_shard={dp})" if dp > 1 else ""),
            f"use {_nearest_multiples(t.global_batch_tokens, cfg.data.seq_len * dp)}",
        )
    if t.num_tokens < cfg.tokens_per_step:
        raise ConfigError(
            "train.num_tokens",
            f"{t.num_tokens} is less than one step ({cfg.tokens_per_step} tokens)",
            "raise train.num_tokens or lower train.global_batch_tokens",
        )
    local = cfg.global_batch_sequences // dp
    if t.micro_batch_sequences < 0 or (t.micro_batch_sequences and local % t.micro_batch_sequences):
        raise ConfigError(
            "train.micro_batch_sequences",
            f"{t.micro_batch_sequences} does not divide the {local} sequences per rank",
            "pick a divisor, or 0 for no accumulation",
        )
    if t.device not in ("auto", "cpu", "cuda"):
        raise ConfigError("train.device", f"{t.device!r} unknown", "use auto, cpu or cuda")
    if t.dtype not in ("auto", "fp32", "bf16"):
        raise ConfigError("train.dtype", f"{t.dtype!r} unknown", "use auto, fp32 or bf16")
    if t.max_loss_spike and t.max_loss_spike <= 1:
        raise ConfigError("train.max_loss_spike", f"{t.max_loss_spike} must be > 1", "e.g. 3.0, or 0 to disable")
    if o.lr <= 0:
        raise ConfigError("optim.lr", f"{o.lr} must be > 0", "e.g. 3e-4")
    if o.weight_decay < 0 or o.grad_clip < 0 or o.z_loss < 0:
        raise ConfigError("optim", "weight_decay, grad_clip and z_loss must be >= 0", "fix the negative value")
    if not (0 <= o.beta1 < 1 and 0 <= o.beta2 < 1):
        raise ConfigError("optim.beta1", "betas must lie in [0, 1)", "e.g. beta1=0.9, beta2=0.95")
    if s.name not in SCHEDULES:
        raise ConfigError("schedule.name", f"{s.name!r} unknown", f"use one of {', '.join(SCHEDULES)}")
    if s.decay_shape not in ("linear", "sqrt", "cosine"):
        raise ConfigError("schedule.decay_shape", f"{s.decay_shape!r} unknown", "use linear, sqrt or cosine")
    if not 0 <= s.warmup_fraction < 1 or not 0 < s.decay_fraction <= 1 or not 0 <= s.min_lr_ratio <= 1:
        raise ConfigError(
            "schedule",
            "warmup_fraction in [0,1), decay_fraction in (0,1], min_lr_ratio in [0,1]",
            "fix the out-of-range value",
        )
    if cfg.warmup_tokens >= t.num_tokens:
        raise ConfigError("schedule.warmup_tokens", "warmup is as long as the run", "shorten the warmup")
    if cfg.logging.wandb not in ("offline", "disabled", "online"):
        raise ConfigError("logging.wandb", f"{cfg.logging.wandb!r} unknown", "use offline, disabled or online")
    if cfg.logging.progress not in ("auto", "on", "off"):
        raise ConfigError("logging.progress", f"{cfg.logging.progress!r} unknown", "use auto, on or off")
    for key in ("eval.interval_steps", "checkpoint.interval_steps", "checkpoint.keep_last"):
        section, name = key.split(".")
        if getattr(getattr(cfg, section), name) < 0:
            raise ConfigError(key, "must be >= 0", "use 0 to disable")
    if cfg.eval.tasks:
        try:
            load_tasks(cfg.eval.tasks, limit=1)
        except (ValueError, OSError) as e:  # ConfigError included: re-keyed to the config path
            raise ConfigError("eval.tasks", str(e).splitlines()[0]) from None
    if cfg.logging.interval_steps < 1:
        raise ConfigError("logging.interval_steps", "must be >= 1", "e.g. 1 or 10")
    if cfg.eval.val_batch_sequences < 1:
        raise ConfigError("eval.val_batch_sequences", f"{cfg.eval.val_batch_sequences} must be >= 1", "e.g. 16")
    if t.num_threads < 0:
        raise ConfigError("train.num_threads", f"{t.num_threads} must be >= 0", "0 keeps torch's default")
    if any(n < 1 for n in cfg.profile.steps):  # steps past the end are skipped: a sweep's runs differ in length
        raise ConfigError("profile.steps", f"{cfg.profile.steps}: steps count from 1", "e.g. [10, 11]")
    # the layout against the model shape and the batch (world-size-1 runs included)
    ParallelDims.from_config(
        cfg.parallel,
        world_size=cfg.parallel.world_size,
        model=cfg.model,
        seq_len=cfg.data.seq_len,
        global_batch_sequences=cfg.global_batch_sequences,
        micro_batch_sequences=t.micro_batch_sequences,
    )


def _nearest_multiples(value: int, step: int) -> str:
    """'64 or 128': the multiples of `step` around `value` (the smallest valid one when below it)."""
    lo = value // step * step
    return f"{lo} or {lo + step}" if lo > 0 else f"{step} (one sequence per data-parallel rank) or more"


__all__ = [
    "CheckpointConfig",
    "EvalConfig",
    "LoggingConfig",
    "OptimConfig",
    "ProfileConfig",
    "RunConfig",
    "ScheduleConfig",
    "TrainLoopConfig",
    "build_run_config",
    "load_run_config",
    "padded_vocab_size",
    "to_dict",
    "validate_run_config",
]
