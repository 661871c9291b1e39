"""Inputs built to hurt: refused with one line and exit 2, in bounded memory (issue 30, item 7).

A YAML alias bomb (each level repeats the one below ten times), a token-shard index whose dtype
makes numpy read file bytes as object pointers, and a checkpoint whose metadata names a tensor far
larger than its files. Each runs as its own process: on the code before the fix the first two end
in an out-of-memory kill or a segfault, which must not take the test session down with them.
"""

from __future__ import annotations

import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scalelab.store.checkpoint_files import list_checkpoints
from scalelab.train.checkpoint_verify import MANIFEST, file_entry, read_metadata
from scalelab.train.config import build_run_config
from scalelab.train.loop import train_run

GIB = 1 << 30
RUN = {
    "name": "hostile",
    "model": {"preset": "debug"},
    "data": {"seq_len": 32, "val_sequences": 4},
    "train": {"num_tokens": 2 * 128, "global_batch_tokens": 128, "num_threads": 1},
    "eval": {"interval_steps": 0, "val_batch_sequences": 4},
    "checkpoint": {"interval_steps": 0},
    "logging": {"wandb": "disabled", "progress": "off"},
}


def _cli(args: list[str], cwd: Path, limit_bytes: int = 4 * GIB) -> tuple[subprocess.CompletedProcess, int]:
    """`python -m scalelab.cli ARGS` as its own process under an address-space limit; (result, its peak RSS)."""

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    out, err = cwd / ".cli.out", cwd / ".cli.err"
    with open(out, "w") as fo, open(err, "w") as fe:
        p = subprocess.Popen([sys.executable, "-P", "-m", "scalelab.cli", *args], cwd=cwd, stdout=fo, stderr=fe,
                             preexec_fn=limit)  # fmt: skip
        _, status, usage = os.wait4(p.pid, 0)  # this child's own rusage
    p.returncode = os.waitstatus_to_exitcode(status)
    r = subprocess.CompletedProcess(p.args, p.returncode, out.read_text(), err.read_text())
    out.unlink()
    err.unlink()
    return r, usage.ru_maxrss * 1024


def _alias_bomb(levels: int) -> str:
    """A 'billion laughs' YAML: level k is a list of ten references to level k-1 (10**levels leaves)."""
    lines = ['l0: &l0 ["lol"]']
    for k in range(1, levels + 1):
        lines.append(f"l{k}: &l{k} [" + ", ".join([f"*l{k - 1}"] * 10) + "]")
    lines.append(f"model: {{preset: debug}}\ntags: {{bomb: *l{levels}}}")
    return "\n".join(lines) + "\n"


def test_a_yaml_alias_bomb_is_refused_within_1_gib(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_alias_bomb(9))
    assert len(bomb.read_bytes()) < 1000
    r, peak = _cli(["run", str(bomb), "--out", "o"], tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "bomb.yaml" in err and "alias" in err, err
    assert 0 < peak < GIB, f"peak RSS {peak / GIB:.2f} GiB"
    assert not (tmp_path / "o").exists()
    spec = tmp_path / "bomb_sweep.yaml"
    spec.write_text(_alias_bomb(9) + "grid: {optim.lr: [0.001]}\n")
    r, peak = _cli(["sweep", "plan", str(spec), "--no-measure"], tmp_path)
    assert r.returncode == 2 and "alias" in r.stderr and 0 < peak < GIB, r.stderr[-2000:]


def _string_bomb(refs_per_level: int, string_bytes: int = 20_000) -> str:
    """A YAML of a few KB whose aliases name one long string refs_per_level**2 times (issue 51: 20 KB
    and 333**2 = 111k references expand to 2.2 GB of text while counting only ~111k values)."""
    refs = ", ".join(["*s"] * refs_per_level)
    return (
        f"s: &s {'x' * string_bytes}\nb: &b [{refs}]\n"
        f"c: [{', '.join(['*b'] * refs_per_level)}]\nmodel: {{preset: debug}}\n"
    )


def test_an_alias_bomb_of_long_strings_is_refused_by_its_expanded_bytes(tmp_path):
    """The 20 KB document that made `json.loads(json.dumps(data))` in the run config builder die
    with a MemoryError at 2.2-2.8 GiB: refused with one line, exit 2, well under 1 GiB."""
    bomb = tmp_path / "strings.yaml"
    bomb.write_text(_string_bomb(333))
    assert len(bomb.read_bytes()) < 25_000
    r, peak = _cli(["run", str(bomb), "--out", "o"], tmp_path)
    err = r.stderr.strip()
    assert r.returncode == 2 and len(err.splitlines()) == 1 and "alias" in err and "bytes" in err, err[-2000:]
    assert 0 < peak < GIB, f"peak RSS {peak / GIB:.2f} GiB"
    assert not (tmp_path / "o").exists()


_LIMITS_CHECK = """
import io, sys
from scalelab.config_tree import load_yaml, safe_yaml
from scalelab.errors import ConfigError
for load in (lambda: load_yaml(sys.argv[1]), lambda: safe_yaml(io.StringIO(open(sys.argv[1]).read()), "s3://b/x.yaml")):
    try:
        load()
        print("accepted")
    except ConfigError as e:
        print(e)
"""


@pytest.mark.parametrize(
    "name, text, words",
    [
        ("bomb", _string_bomb(30) + "grid: {optim.lr: [0.001]}\n", "alias"),  # 18 MB of text
        ("deep", "grid: {optim.lr: [0.001]}\ntags: " + "[" * 50_000 + "]" * 50_000 + "\n", "nested more than 64"),
        ("big", "grid: {optim.lr: [0.001]}\ntags:\n" + "".join(f"  k{i}: v{i}\n" for i in range(130_000)), "bytes"),
    ],
    ids=["alias-bomb", "deep", "big"],
)
def test_a_document_past_the_yaml_limits_is_one_config_error(tmp_path, name, text, words):
    """Bytes, nesting depth and alias-expanded size, for a file (a run config, a spec) and for text (a
    round's spec read from a bucket): a ConfigError naming it, never a RecursionError or MemoryError.
    In a process of its own (config_tree alone, no torch): libyaml's composer recurses in C, and
    50,000 levels crash the process that parses them unchecked."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    r = subprocess.run([sys.executable, "-P", "-c", _LIMITS_CHECK, str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    from_file, from_text = r.stdout.splitlines()
    assert from_file.startswith(f"{path}: ") and words in from_file, from_file
    assert from_text.startswith("s3://b/x.yaml: ") and words in from_text, from_text


def test_anchors_within_reason_still_work(tmp_path):
    from scalelab.config_tree import load_yaml

    path = tmp_path / "ok.yaml"
    path.write_text("base: &b {lr: 0.001, wd: 0.1}\nrun1: *b\nrun2: {<<: *b, lr: 0.002}\n")
    assert load_yaml(str(path)) == {
        "base": {"lr": 0.001, "wd": 0.1},
        "run1": {"lr": 0.001, "wd": 0.1},
        "run2": {"lr": 0.002, "wd": 0.1},
    }


def test_a_shard_index_with_an_object_dtype_is_refused_before_indexing(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    for split in ("train", "val"):
        (shards / f"{split}.bin").write_bytes(b"\x41" * 16)  # two 8-byte "pointers"
    index = {
        "format": "scalelab-shards-v1",
        "dtype": "O",
        "tokenizer": "byte",
        "tokenizer_fingerprint": "x",
        "vocab_size": 257,
        "splits": {s: {"num_tokens": 2, "num_bytes": 2, "num_documents": 1} for s in ("train", "val")},
        "sources": ["x"],
        "content_hash": "0" * 64,
    }
    (shards / "index.json").write_text(json.dumps(index))
    r, _ = _cli(["data", "info", str(shards)], tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "dtype" in err and "'O'" in err, err
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump(dict(RUN, data={**RUN["data"], "sources": [{"name": "x", "path": str(shards)}]})))
    r, _ = _cli(["run", str(run), "--out", "o"], tmp_path)
    assert r.returncode == 2 and "'O'" in r.stderr, (r.returncode, r.stderr[-2000:])


def test_export_refuses_metadata_that_names_a_tensor_larger_than_its_files(tmp_path):
    run = tmp_path / "run"
    assert train_run(build_run_config(RUN), run)["status"] == "done"
    ckpt = list_checkpoints(run / "checkpoints")[-1][1]
    meta = read_metadata(ckpt / ".metadata")
    fqn = next(k for k in meta.state_dict_metadata if k.startswith("model.") and "embed" in k)
    meta.state_dict_metadata[fqn].size = type(meta.state_dict_metadata[fqn].size)((1 << 20, 1 << 20))  # 4 TiB
    (ckpt / ".metadata").write_bytes(pickle.dumps(meta))
    manifest = json.loads((ckpt / MANIFEST).read_text())
    manifest["files"][".metadata"] = file_entry(ckpt / ".metadata")
    (ckpt / MANIFEST).write_text(json.dumps(manifest))
    r, peak = _cli(["export", str(ckpt), "--hf", str(tmp_path / "hf")], tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and fqn.removeprefix("model.") in err, err
    assert not (tmp_path / "hf").exists()
    shutil.rmtree(run)


@pytest.mark.parametrize("argv", [["--max-shard-gb", "inf"], ["--max-shard-gb", "nan"]])
def test_export_shard_size_must_be_finite(tmp_path, capsys, argv):
    from scalelab.cli.main import main

    assert main(["export", str(tmp_path), "--hf", str(tmp_path / "hf"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--max-shard-gb" in err, err


def test_an_override_index_that_is_not_an_ascii_number_is_one_line(tmp_path, capsys):
    from scalelab.cli.main import main

    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(RUN))
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--set", "data.sources.².weight=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "data.sources.²" in err, err
    assert not (tmp_path / "o").exists()


def test_escape_sequences_from_a_spec_or_a_store_never_reach_the_terminal_raw(tmp_path, capsys):
    """A spec name holding ESC is refused (one line, shown escaped); a name planted in a store's
    records is printed escaped by `sweep status` (issue 51)."""
    from scalelab import store
    from scalelab.cli.main import main
    from scalelab.sweeps.specs.spec import expand_sweep

    evil = "x\x1b]0;pwned\x07\x1b[2J\r"
    spec = {"name": evil, "base": RUN, "grid": {"optim.lr": [1e-3]}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    assert main(["sweep", "plan", str(tmp_path / "s.yaml"), "--no-measure"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "control characters" in err and "\\x1b" in err, err
    assert "\x1b" not in err and "\r" not in err and "\x07" not in err
    sd = tmp_path / "root" / "s"
    spec["name"] = "s"
    store.init_sweep(sd, yaml.safe_dump(spec), "s", [r.to_dict() for r in expand_sweep(spec).runs], "s")
    resolved = json.loads((sd / "sweep.resolved.json").read_text())
    (sd / "sweep.resolved.json").write_text(json.dumps(dict(resolved, name=evil)))
    assert main(["sweep", "status", str(sd)]) == 0
    out = capsys.readouterr().out
    assert "x\\x1b]0;pwned\\x07\\x1b[2J\\r" in out and "\x1b" not in out and "\r" not in out, out
