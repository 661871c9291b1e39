"""`scalelab export CKPT --hf OUT`: checkpoints of any layout as Hugging Face folders.

Contract: a checkpoint written by a real training run (one device, and fsdp2 x tp2 on 4 gloo ranks
through `scalelab run`) is exported; transformers' AutoModelForCausalLM loads the folder and its
logits equal scalelab's for the same checkpoint within 1e-5 (fp32, eager attention, CPU); the
exported tokenizer encodes text to the ids scalelab trained on. Sharded output (several
safetensors files and the index) loads the same. MoE blocks that are not Mixtral's are refused
with the field named, and nothing is written.
"""

from __future__ import annotations

import json

import pytest
import torch
import yaml

transformers = pytest.importorskip("transformers")

from scalelab.cli.main import main  # noqa: E402
from scalelab.errors import ConfigError  # noqa: E402
from scalelab.train.config import build_run_config  # noqa: E402
from scalelab.train.data.tokenizer import load_tokenizer  # noqa: E402
from scalelab.train.eval_checkpoint import load_checkpoint_model  # noqa: E402
from scalelab.train.export_hf import export_hf  # noqa: E402
from scalelab.train.loop import train_run  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
TOL = 1e-5

BASE = {
    "name": "export",
    "model": {"preset": "debug"},
    "data": {"seq_len": 32, "val_sequences": 8},
    "train": {"num_tokens": 3 * 512, "global_batch_tokens": 512, "seed": 3, "device": "cpu"},
    "eval": {"interval_steps": 0, "val_batch_sequences": 4},
    "checkpoint": {"interval_steps": 3, "keep_last": 1},
    "logging": {"wandb": "disabled", "progress": "off"},
    "optim": {"lr": 1e-2},
}
TEXT = "def f(x):\n    return x  # é\n"


def _logits_match(ckpt, hf_dir) -> float:
    ours, cfg, _ = load_checkpoint_model(ckpt)
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager").eval()
    tokens = torch.randint(0, 257, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (hf(input_ids=tokens).logits - ours(tokens)).abs().max().item()
    # a trained checkpoint, not an initial one: the export carries what training changed
    assert diff <= TOL, diff
    return diff


def test_single_device_checkpoint_exports_and_loads_in_transformers(tmp_path):
    cfg = build_run_config(BASE)
    train_run(cfg, tmp_path / "run")
    ckpt = tmp_path / "run" / "checkpoints" / "step_3"
    summary = export_hf(ckpt, tmp_path / "hf")
    assert summary["architecture"] == "LlamaForCausalLM" and summary["shards"] == 1
    _logits_match(ckpt, tmp_path / "hf")

    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ours = load_tokenizer("byte")
    assert tok(TEXT)["input_ids"] == ours.encode(TEXT)
    assert tok.convert_tokens_to_ids("<|endoftext|>") == ours.eot_id
    assert tok.decode(ours.encode(TEXT)) == TEXT

    # several shards: the index maps every tensor and transformers loads the same weights
    summary = export_hf(ckpt, tmp_path / "hf_sharded", max_shard_bytes=200_000)
    assert summary["shards"] > 1
    index = json.loads((tmp_path / "hf_sharded" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {p.name for p in (tmp_path / "hf_sharded").glob("*.safetensors")}
    _logits_match(ckpt, tmp_path / "hf_sharded")

    with pytest.raises(Exception, match="not empty"):
        export_hf(ckpt, tmp_path / "hf")


def test_fsdp2_tp2_checkpoint_exports_through_the_cli(tmp_path, capsys):
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(BASE))
    sets = ["--set", "parallel.dp_shard=2", "--set", "parallel.tp=2"]
    assert main(["run", str(cfg_path), "--out", str(tmp_path / "run"), *sets]) == 0
    run_cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert run_cfg["parallel"]["dp_shard"] == 2 and run_cfg["parallel"]["tp"] == 2
    capsys.readouterr()
    assert main(["export", str(tmp_path / "run"), "--hf", str(tmp_path / "hf")]) == 0
    assert "LlamaForCausalLM" in capsys.readouterr().out
    print(
        "fsdp2xtp2 -> transformers max |logit diff|:",
        _logits_match(tmp_path / "run" / "checkpoints" / "step_3", tmp_path / "hf"),
    )


def test_moe_that_is_not_mixtral_is_refused_and_a_matching_one_loads_as_mixtral(tmp_path):
    moe = {**BASE, "model": {"preset": "moe-debug"}}
    top2 = build_run_config(moe)
    train_run(top2, tmp_path / "top2")
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        export_hf(tmp_path / "top2" / "checkpoints" / "step_3", tmp_path / "hf_top2")
    assert not (tmp_path / "hf_top2").exists()

    # every token takes every expert: Mixtral's renormalised top-k weights are scalelab's softmax
    every = build_run_config(moe, [f"model.num_experts_per_tok={top2.model.num_experts}"])
    train_run(every, tmp_path / "every")
    ckpt = tmp_path / "every" / "checkpoints" / "step_3"
    summary = export_hf(ckpt, tmp_path / "hf")
    assert summary["architecture"] == "MixtralForCausalLM"
    _logits_match(ckpt, tmp_path / "hf")


def test_gelu_mlp_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys):
    """Llama's MLP is SwiGLU: `scalelab export` of a GELU-MLP run exits 2 with one line naming
    model.mlp, before writing the output folder."""
    cfg = build_run_config({**BASE, "model": {"preset": "debug", "mlp": "gelu"}})
    train_run(cfg, tmp_path / "run")
    capsys.readouterr()
    assert main(["export", str(tmp_path / "run"), "--hf", str(tmp_path / "hf")]) == 2
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and "model.mlp" in err and "swiglu" in err, err
    assert not (tmp_path / "hf").exists()
