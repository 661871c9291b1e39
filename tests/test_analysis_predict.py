"""Two-step downstream prediction (compute -> task bpb -> accuracy) on a synthetic store."""

import json

import pytest

from scalelab.analysis.downstream import predict_task
from scalelab.analysis.store_reader import load_evals, load_store_runs
from scalelab.analysis.synthetic import SyntheticLaw, isoflop_design, write_synthetic_sweep
from scalelab.errors import UsageError


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("pt") / "s"
    write_synthetic_sweep(root, isoflop_design([1e13, 1e14, 1e15]), SyntheticLaw(), seeds=[0])
    return root


def test_two_step_prediction_covers_the_truth(store):
    law = SyntheticLaw()
    runs = load_store_runs(store)
    evals = load_evals(runs)
    n, d = 1.7e6, 2e8  # inside the sweep's range (C = 2e15, 2x the largest budget)
    # 100 draws: on these 11 runs a 40-draw percentile interval's ends move by ~0.01 bpb from seed to seed
    pred = predict_task(runs, evals, task="synthetic/mc", params=n, tokens=d, n_boot=100)
    loss = float(law.loss(n, d))
    true_bpb = law.task_bpb_slope * loss + law.task_bpb_offset
    true_acc = float(law.accuracy(loss))
    print(
        f"bpb {pred.bpb:.4f} {pred.bpb_interval} (true {true_bpb:.4f}); acc {pred.acc:.4f} {pred.acc_interval} "
        f"(true {true_acc:.4f})"
    )
    assert pred.bpb_interval[0] <= true_bpb <= pred.bpb_interval[1]
    assert pred.acc_interval[0] <= true_acc <= pred.acc_interval[1]
    assert abs(pred.acc - true_acc) < 0.05  # within ~2 points is the OLMo ladder's claim; 5 here
    assert pred.weighted and pred.n_runs == runs.height
    with pytest.raises(UsageError, match="tasks in this store"):
        predict_task(runs, evals, task="nope", params=n, tokens=d, n_boot=0)


def test_predict_task_cli(store, capsys):
    from scalelab.cli.main import main

    rc = main(
        [
            "predict-task",
            str(store),
            "--task",
            "synthetic/mc",
            "--params",
            "1e6",
            "--tokens",
            "1e8",
            "--bootstrap",
            "5",
            "--json",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["task"] == "synthetic/mc" and 0 <= out["acc"] <= 1 and out["bpb"] > 0
    assert main(["predict-task", str(store), "--task", "synthetic/mc", "--params", "-1", "--tokens", "1e8"]) == 2
