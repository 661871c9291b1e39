"""mup under FSDP2 and TP matches one device: the parametrization's AdamW groups (hidden LR / width
multiplier) and forward multipliers survive sharding (scalelab.parallel.parity, gloo, CPU).

Model: the parity debug model at width 64 relative to a base of width 32 (width multiplier 2:
hidden LR halved, logits / 2, attention logits 1/d_head), 4 layers; completep at base depth 2 adds
the 1/2 residual-branch multiplier. Tolerance 1e-5 (absolute, loss and every parameter), as for
the sp layouts in test_parallel_parity.py (AdamW lr 1e-4 there: a group at the wrong LR moves its
parameters by ~5e-5 per step, so a lost group fails).
"""

import dataclasses

import pytest
import torch

from scalelab.parallel.parity import ParitySpec, debug_model, run_parity_jobs

FP32_TOL = 1e-5


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def test_mup_and_completep_fsdp2_tp2_match_one_device():
    mup = dataclasses.replace(debug_model(), parametrization="mup", base_d_model=32, base_head_dim=8)
    completep = dataclasses.replace(mup, parametrization="completep", base_num_layers=2)
    jobs = [
        (["fsdp2", "tp2"], ParitySpec(model=mup, optimizer="adamw", tolerance=FP32_TOL)),
        (["fsdp2", "tp2sp"], ParitySpec(model=completep, optimizer="adamw", tolerance=FP32_TOL)),
    ]
    report = run_parity_jobs(jobs)
    assert len(report.rows) == 4
    bad = [(r.layout, r.max_loss_diff, r.max_param_diff, r.worst_param) for r in report.rows if not r.ok]
    assert not bad, bad
    for r in report.rows:
        assert r.max_loss_diff <= FP32_TOL and r.max_param_diff <= FP32_TOL
