"""Coordinate check (scalelab.train.coordcheck, `scalelab coordcheck`): under mup every layer's RMS
after 4 AdamW steps is flat in width (log-log slope within ±0.1), under sp it grows, and a µP
without its hidden-LR scaling is caught.

Cheap sizes: widths 32..256 (4 heads), 2 layers, 8 sequences of 32 tokens, 3 inits per model.
"""

import json

import pytest
import torch

from scalelab.cli.main import main
from scalelab.models import parametrization
from scalelab.models.config import ModelConfig
from scalelab.train.config import OptimConfig
from scalelab.train.coordcheck import coord_check

pytestmark = pytest.mark.usefixtures("one_thread")

WIDTHS = [32, 64, 128, 256]
CFG = ModelConfig(
    vocab_size=64, num_layers=2, d_model=32, num_heads=4, num_kv_heads=4, d_ff=96, max_seq_len=64, kernels="torch"
)


def _batches():
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, 32, (8, 33), generator=gen) for _ in range(4)]  # 32 of 64 ids: learnable


def _check(names):
    return coord_check(
        CFG, widths=WIDTHS, steps=4, batches=_batches(), optim_cfg=OptimConfig(lr=1e-2), parametrizations=names
    )


def test_mup_flat_in_width_sp_grows():
    check = _check(["sp", "mup"])
    layers = check.layers(2)
    assert {"embedding", "block0.attn", "block0.ffn", "block1", "logits"} <= set(layers)
    mup = {k: check.slopes[("mup", 2, k)] for k in layers}
    sp = {k: check.slopes[("sp", 2, k)] for k in layers}
    assert all(abs(s) <= 0.1 for s in mup.values()), mup
    # SP at the smallest width's LR: every hidden layer grows at least ~width^1 (measured 1.5-2.7)
    assert all(sp[k] > 1.0 for k in layers if k.startswith("block")), sp
    assert "max |slope|" in check.table()


def test_a_mup_without_hidden_lr_scaling_is_caught(monkeypatch):
    monkeypatch.setattr(parametrization, "lr_scale", lambda cfg, name, ndim: 1.0)
    check = _check(["mup"])
    assert max(abs(check.slopes[("mup", 2, k)]) for k in check.layers(2)) > 0.5


def test_cli_table_plot_and_bad_widths(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "model: {vocab_size: 320, num_layers: 2, d_model: 32, num_heads: 4, num_kv_heads: 4, d_ff: 96, "
        "max_seq_len: 64, kernels: torch}\ndata: {seq_len: 32}\noptim: {lr: 0.01}\n"
    )
    out = tmp_path / "cc"
    assert main(["coordcheck", str(cfg), "--widths", "32,64,36", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--widths" in err[0] and not out.exists()
    argv = ["coordcheck", str(cfg), "--widths", "32,64", "--steps", "2", "--seeds", "1", "--out", str(out)]
    assert main(argv + ["--parametrizations", "sp,mup", "--depths", "1,2"]) == 0
    text = capsys.readouterr().out
    assert "mup, 2 layers: RMS after step 2" in text and "depth slopes" in text
    record = json.loads((out / "coordcheck.json").read_text())
    assert {r["parametrization"] for r in record["rows"]} == {"sp", "mup"}
    assert (out / "coordcheck.png").stat().st_size > 10_000
