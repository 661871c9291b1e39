"""Export a scalelab checkpoint of any layout as a Hugging Face model folder.

    export_hf(ckpt_dir, out_dir)                         # scalelab export CKPT --hf OUT
    export_hf(ckpt_dir, out_dir, dtype=torch.bfloat16, max_shard_bytes=2 << 30)

The folder holds config.json, model.safetensors (or model-0000K-of-0000M.safetensors shards with
model.safetensors.index.json), tokenizer.json, tokenizer_config.json and generation_config.json, so
`transformers.AutoModelForCausalLM.from_pretrained(OUT)` (and lm-eval-harness, vLLM) load it.

The checkpoint is read the way every scalelab load reads it (verified first, metadata through the
restricted unpickler, nothing in it executed) and one shard at a time: DCP reassembles the tensors
of one output shard from whatever layout wrote them (FSDP, TP, PP, EP shards), they are renamed,
written and dropped, so the export never holds more than one output shard of weights in memory.

Architectures:
  dense (family llama)  -> LlamaForCausalLM (qk_norm and a GELU MLP, which Llama lacks, are refused)
  moe                   -> MixtralForCausalLM when the block is Mixtral's: softmax router whose top-k
                           weights sum to one (Mixtral renormalises them over the k picks; scalelab
                           does not, so the two agree only when every token takes every expert), no
                           shared experts, dropless. Anything else is refused, naming the field.
Tokenizers: a BPE tokenizer.json is copied; the byte tokenizer is written as the equivalent
byte-level tokenizer (ids 0..255 are the bytes, 256 is <|endoftext|>), so HF encodes text to the
same ids scalelab trained on.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from scalelab.errors import ConfigError, UsageError
from scalelab.models.config import ModelConfig
from scalelab.models.hf_llama import hf_key_map, to_hf_config
from scalelab.train.checkpoint import single_process_ok, verify
from scalelab.train.checkpoint_verify import METADATA, SafeLoadPlanner, SafeReader, read_metadata
from scalelab.train.config import RunConfig, load_run_config
from scalelab.train.data.tokenizer import EOT_TEXT, byte_level_alphabet, load_tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_MODEL_PREFIX = "model."


def _moe_refusal(cfg: ModelConfig) -> tuple[str, str, str] | None:
    """(key, why, fix) when the MoE block is not Mixtral's, else None."""
    if cfg.router_gating != "softmax":
        return "model.router_gating", f"{cfg.router_gating!r}: Mixtral's router is a softmax", "train with softmax"
    if cfg.num_shared_experts:
        return "model.num_shared_experts", f"{cfg.num_shared_experts}: Mixtral has no shared experts", "set 0"
    if cfg.capacity_factor:
        return "model.capacity_factor", f"{cfg.capacity_factor}: Mixtral is dropless", "set 0 (dropless)"
    if cfg.num_experts_per_tok != cfg.num_experts:
        return (
            "model.num_experts_per_tok",
            f"{cfg.num_experts_per_tok} of {cfg.num_experts} experts: scalelab weighs the picks by their "
            "softmax scores, Mixtral renormalises them to sum to one, so the logits would differ",
            "export a dense model, or one whose top-k equals num_experts",
        )
    if cfg.qk_norm:
        return "model.qk_norm", "true: Mixtral has no q/k norm", "set qk_norm: false"
    return None


def hf_architecture(cfg: ModelConfig) -> tuple[str, dict[str, Any], dict[str, str]]:
    """(architecture name, HF config fields, scalelab key -> HF key) for a model config.

    Raises:
        ConfigError: the architecture has no exact Hugging Face counterpart here.
    """
    if cfg.family == "llama":
        fields = to_hf_config(cfg)
        return "LlamaForCausalLM", {"model_type": "llama", **fields}, dict(hf_key_map(cfg))
    refusal = _moe_refusal(cfg)
    if refusal is not None:
        raise ConfigError(*refusal)
    dense = dataclasses.replace(cfg, family="llama")
    fields = to_hf_config(dense)
    fields.pop("mlp_bias")
    fields.update(
        intermediate_size=cfg.expert_d_ff,
        num_local_experts=cfg.num_experts,
        num_experts_per_tok=cfg.num_experts_per_tok,
        router_aux_loss_coef=cfg.router_aux_loss_weight,
        output_router_logits=False,
        sliding_window=None,
    )
    keys = {ours: theirs for ours, theirs in hf_key_map(dense) if ".feed_forward." not in ours}
    for i in range(cfg.num_layers):
        keys[f"layers.{i}.feed_forward.router.gate.weight"] = f"model.layers.{i}.block_sparse_moe.gate.weight"
        for w in ("w1", "w2", "w3"):  # stacked [E, ...] here, one tensor per expert there
            keys[f"layers.{i}.feed_forward.experts.{w}"] = f"model.layers.{i}.block_sparse_moe.experts.{{e}}.{w}.weight"
    return "MixtralForCausalLM", {"model_type": "mixtral", **fields}, keys


def _hf_tensors(ours: str, theirs: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    if "{e}" in theirs:
        return {theirs.format(e=e): tensor[e].contiguous() for e in range(tensor.shape[0])}
    return {theirs: tensor}


def _plan_shards(
    meta_items: list[tuple[str, TensorStorageMetadata]], dtype: torch.dtype, max_bytes: int
) -> list[list[tuple[str, TensorStorageMetadata]]]:
    shards, current, size = [], [], 0
    for fqn, tmeta in meta_items:
        nbytes = torch.Size(tmeta.size).numel() * dtype.itemsize
        if current and size + nbytes > max_bytes:
            shards.append(current)
            current, size = [], 0
        current.append((fqn, tmeta))
        size += nbytes
    if current:
        shards.append(current)
    return shards


def _check_sizes(ckpt: Path, items: list[tuple[str, TensorStorageMetadata]]) -> None:
    """Every tensor the metadata names fits in the checkpoint's data files (export allocates each
    one whole: a crafted size would otherwise allocate whatever it says)."""
    data_bytes = sum(p.stat().st_size for p in ckpt.glob("*.distcp"))
    for ours, tmeta in items:
        nbytes = torch.Size(tmeta.size).numel() * tmeta.properties.dtype.itemsize
        if nbytes > data_bytes:
            raise UsageError(
                f"{ckpt}: the metadata gives tensor {ours!r} the shape {tuple(tmeta.size)} ({nbytes:,} bytes), more "
                f"than the checkpoint's {data_bytes:,} bytes of data; refusing to export it"
            )


def _load_tensors(ckpt: Path, items: list[tuple[str, TensorStorageMetadata]]) -> dict[str, torch.Tensor]:
    """The full tensors of `items` (checkpoint keys without the "model." prefix), resharded by DCP."""
    model_sd = {fqn: torch.empty(tuple(tmeta.size), dtype=tmeta.properties.dtype) for fqn, tmeta in items}
    with single_process_ok():
        dcp.load({"model": model_sd}, storage_reader=SafeReader(ckpt), planner=SafeLoadPlanner(ckpt))
    return model_sd


def write_tokenizer(cfg: RunConfig, out: Path) -> None:
    """tokenizer.json + tokenizer_config.json encoding text to the ids the run was trained on.

    A copied tokenizer.json loses a post-processor that adds special tokens (a Llama file's `<s>`):
    the run's documents were encoded without them, so `AutoTokenizer` must not add them either."""
    if cfg.data.tokenizer == "byte":
        _byte_level_tokenizer().save(str(out / "tokenizer.json"))
    else:
        spec = json.loads(Path(cfg.data.tokenizer).expanduser().read_text(encoding="utf-8"))
        if isinstance(spec.get("post_processor"), dict) and spec["post_processor"].get("type") != "ByteLevel":
            spec["post_processor"] = None
        (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": load_tokenizer(cfg.data.tokenizer).eot_text,
        "model_max_length": cfg.model.max_seq_len,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")


def _byte_level_tokenizer() -> Tokenizer:
    """A `tokenizers` byte-level BPE with no merges: token i is byte i, <|endoftext|> is 256."""
    tok = Tokenizer(models.BPE(vocab=byte_level_alphabet(), merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOT_TEXT])
    return tok


def export_hf(
    checkpoint: str | Path,
    out: str | Path,
    *,
    dtype: torch.dtype | None = None,
    max_shard_bytes: int = 5 << 30,
) -> dict[str, Any]:
    """Write checkpoint `checkpoint` (a run's checkpoints/step_N) as a Hugging Face folder `out`.

    Returns a summary: architecture, shards, tensors, parameters, dtype, step.

    Raises:
        CheckpointError: the checkpoint is missing, corrupt or refused.
        ConfigError: the architecture has no exact HF counterpart (nothing is written).
        UsageError: `out` exists and is not empty.
    """
    ckpt = Path(checkpoint).expanduser()
    out = Path(out).expanduser()
    train_state = verify(ckpt)
    cfg = load_run_config(str(ckpt.parent.parent / "config.json"))
    arch, fields, keys = hf_architecture(cfg.model)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--hf {out}: the folder is not empty; give a new or empty folder")
    meta = read_metadata(ckpt / METADATA)
    items = []
    for fqn, tmeta in meta.state_dict_metadata.items():
        if not fqn.startswith(_MODEL_PREFIX) or not isinstance(tmeta, TensorStorageMetadata):
            continue
        ours = fqn[len(_MODEL_PREFIX) :]
        if ours == "output.weight" and cfg.model.tied_embeddings:
            continue  # HF ties lm_head to the embedding itself
        if ours not in keys:
            raise UsageError(f"{ckpt}: checkpoint tensor {ours!r} has no place in {arch}")
        items.append((ours, tmeta))
    _check_sizes(ckpt, items)  # before anything is allocated or written
    missing = set(keys) - {ours for ours, _ in items} - ({"output.weight"} if cfg.model.tied_embeddings else set())
    if missing:
        raise UsageError(f"{ckpt}: the checkpoint lacks {sorted(missing)[:3]} (not a full model checkpoint?)")
    out_dtype = dtype or items[0][1].properties.dtype
    shards = _plan_shards(items, out_dtype, max_shard_bytes)
    out.mkdir(parents=True, exist_ok=True)
    weight_map, num_params = {}, 0
    for k, shard in enumerate(shards):
        name = "model.safetensors" if len(shards) == 1 else f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for ours, tensor in _load_tensors(ckpt, shard).items():
            num_params += tensor.numel()
            for hf_name, t in _hf_tensors(ours, keys[ours], tensor.to(out_dtype)).items():
                tensors[hf_name] = t
                weight_map[hf_name] = name
        _save_safetensors(tensors, out / name)
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": num_params * out_dtype.itemsize},
            "weight_map": dict(sorted(weight_map.items())),
        }
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    eot = load_tokenizer(cfg.data.tokenizer).eot_id
    config = {
        "architectures": [arch],
        **fields,
        "torch_dtype": str(out_dtype).removeprefix("torch."),
        "eos_token_id": eot,
        "bos_token_id": None,
        "scalelab": {"step": train_state.get("step"), "source": str(ckpt.resolve())},
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eot}, indent=2) + "\n")
    write_tokenizer(cfg, out)
    return {
        "architecture": arch,
        "shards": len(shards),
        "tensors": len(weight_map),
        "parameters": num_params,
        "dtype": str(out_dtype).removeprefix("torch."),
        "step": train_state.get("step"),
    }


def _save_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(path)
