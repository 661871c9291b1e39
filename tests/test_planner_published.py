"""The step-time model against published cluster results (scalelab.parallel.planner_published).

Pins the published rows' inputs (a transcription change must be deliberate), the constants per GPU
type (datasheet peaks), and the error of every row: rows inside the 15% goal must stay inside it,
and every row's error must stay within 2 points of the value recorded in docs/planner-at-scale.md,
so a change to the time model that moves any prediction fails here.
"""

from __future__ import annotations

import pytest

from scalelab.parallel.hardware import GPU_TYPES
from scalelab.parallel.planner_published import (
    evaluate_published,
    format_published,
    megatron_flops_per_step,
    published_rows,
)

# label: (GPUs, seq_len, batch sequences, tp, pp, cp, dp, published figure)
INPUTS = {
    "GPT 1.7B": (32, 2048, 512, 1, 1, 1, 32, 137),
    "GPT 3.6B": (64, 2048, 512, 2, 1, 1, 32, 138),
    "GPT 7.5B": (128, 2048, 512, 4, 1, 1, 32, 142),
    "GPT 18.4B": (256, 2048, 1024, 8, 1, 1, 32, 135),
    "GPT 39.1B": (512, 2048, 1536, 8, 2, 1, 32, 138),
    "GPT 76.1B": (1024, 2048, 1792, 8, 4, 1, 32, 140),
    "GPT 145.6B": (1536, 2048, 2304, 8, 8, 1, 24, 148),
    "GPT 310.1B": (1920, 2048, 2160, 8, 16, 1, 15, 155),
    "GPT 529.6B": (2520, 2048, 2520, 8, 35, 1, 9, 163),
    "GPT 1008.0B": (3072, 2048, 3072, 8, 64, 1, 6, 163),
    "Llama 3 405B 8K GPUs V=2": (8192, 8192, 2048, 8, 16, 1, 64, 0.43),
    "Llama 3 405B 16K GPUs V=2": (16384, 8192, 2048, 8, 16, 1, 128, 0.41),
    "Llama 3 405B 16K GPUs 128K V=2": (16384, 131072, 128, 8, 16, 16, 8, 0.38),
    "torchtitan 8B FSDP8 (500 W)": (8, 8192, 16, 1, 1, 1, 8, 6667),
    "torchtitan 8B FSDP128 (500 W)": (128, 8192, 256, 1, 1, 1, 128, 6514),
    "torchtitan 8B FSDP8 eager (500 W)": (8, 8192, 16, 1, 1, 1, 8, 5762),
    "torchtitan 8B FSDP64 A100": (64, 8192, 64, 1, 1, 1, 64, 2973),
    "torchtitan 70B FSDP64 A100": (64, 8192, 64, 1, 1, 1, 64, 331),
}

# predicted / published - 1 with hardware.GPU_TYPES (the table in docs/planner-at-scale.md)
ERRORS = {
    "GPT 1.7B": 0.135,
    "GPT 3.6B": 0.068,
    "GPT 7.5B": -0.029,
    "GPT 18.4B": 0.054,
    "GPT 39.1B": 0.067,
    "GPT 76.1B": 0.072,
    "GPT 145.6B": 0.055,
    "GPT 310.1B": 0.032,
    "GPT 529.6B": -0.002,
    "GPT 1008.0B": 0.013,
    "Llama 3 405B 8K GPUs V=2": -0.09,
    "Llama 3 405B 16K GPUs V=2": -0.19,
    "Llama 3 405B 16K GPUs 128K V=2": -0.27,
    "Llama 3 405B 8K GPUs V=8 (assumed)": 0.011,
    "Llama 3 405B 16K GPUs V=8 (assumed)": 0.002,
    "Llama 3 405B 16K GPUs 128K V=8 (assumed)": -0.086,
    "torchtitan 8B FSDP8 (500 W)": 0.535,
    "torchtitan 8B FSDP128 (500 W)": 0.324,
    "torchtitan 8B FSDP8 eager (500 W)": 0.776,
    "torchtitan 8B FSDP64 A100": -0.185,
    "torchtitan 70B FSDP64 A100": -0.189,
}
GOAL_MISSES = {  # in the goal, outside 15%: the reasons are in docs/planner-at-scale.md
    "Llama 3 405B 16K GPUs V=2",
    "Llama 3 405B 16K GPUs 128K V=2",
    "torchtitan 8B FSDP8 (500 W)",
    "torchtitan 8B FSDP128 (500 W)",
    "torchtitan 8B FSDP64 A100",
    "torchtitan 70B FSDP64 A100",
}


@pytest.fixture(scope="module")
def results():
    return evaluate_published(search_best=False)


def test_published_inputs_are_pinned():
    rows = {r.label: r for r in published_rows()}
    for label, (gpus, seq, batch, tp, pp, cp, dp, published) in INPUTS.items():
        r = rows[label]
        got = (r.num_gpus, r.seq_len, r.global_batch_sequences, r.tp, r.pp, r.cp, r.dp_replicate * r.dp_shard)
        assert got == (gpus, seq, batch, tp, pp, cp, dp), label
        assert r.published == published, label
        assert r.tp * r.pp * r.cp * r.dp_replicate * r.dp_shard == r.num_gpus, label
    assert set(ERRORS) == set(rows)


def test_constants_are_the_datasheet_ones():
    a100, _ = GPU_TYPES["A100-80GB"]
    h100, _ = GPU_TYPES["H100-SXM"]
    assert (a100.peak_flops, a100.intra_node_bytes_per_s, a100.inter_node_bytes_per_s) == (312e12, 300e9, 25e9)
    assert (h100.peak_flops, h100.intra_node_bytes_per_s, h100.inter_node_bytes_per_s) == (989e12, 450e9, 50e9)
    for hw in (a100, h100):  # NCCL's Ring/Simple latencies (src/graph/tuning.cc): base, NVLink step, network step
        assert (hw.collective_latency_s, hw.intra_node_step_latency_s, hw.inter_node_step_latency_s) == (
            8.4e-6,
            3.4e-6,
            14e-6,
        )


def test_megatron_flop_formula():
    # Eq. 3 for the 1T row gives the paper's aggregate: 163 TFLOP/s x 3072 GPUs = 0.50 EFLOP/s
    rows = {r.label: r for r in published_rows()}
    r = rows["GPT 1008.0B"]
    flops = megatron_flops_per_step(r.cfg, r.seq_len, r.global_batch_sequences)
    # 96·B·s·l·h² (1 + s/6h + V/16lh) with B=3072, s=2048, l=128, h=25600
    assert flops == pytest.approx(96 * 3072 * 2048 * 128 * 25600**2 * (1 + 2048 / 153600 + 51200 / (16 * 128 * 25600)))


def test_error_table_and_bounds(results):
    table = format_published(results)
    for r in results:
        assert r.row.label in table
        assert r.error == pytest.approx(ERRORS[r.row.label], abs=0.02), (r.row.label, r.error)
        if r.row.in_goal and r.row.label not in GOAL_MISSES:
            assert abs(r.error) <= 0.15, (r.row.label, r.error)
    megatron = [r for r in results if r.row.label.startswith("GPT")]
    assert len(megatron) == 10 and all(abs(r.error) <= 0.15 for r in megatron)


def test_the_planner_finds_a_layout_at_least_as_fast_as_the_published_one():
    small = [r for r in published_rows() if r.label == "GPT 7.5B"]
    (res,) = evaluate_published(small, search_best=True)
    assert res.best is not None and res.best.fits
    assert res.best.step_time_s <= res.plan.step_time_s * 1.0001


def test_plan_layout_takes_a_gpu_type(capsys):
    from scalelab.cli.main import main

    base = ["plan-layout", "--model", "1b", "--gpus", "8", "--seq-len", "4096", "--global-batch-tokens", "1M"]
    assert main([*base, "--gpu", "A100-80GB", "--json", "--top", "1"]) == 0
    a100 = capsys.readouterr().out
    assert main([*base, "--json", "--top", "1"]) == 0  # default: H100 figures, as before
    h100 = capsys.readouterr().out
    assert a100 != h100
    assert main([*base, "--gpu", "B200"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--gpu 'B200' unknown" in err
