"""`scalelab data tokenizer | prepare | info`, and one-line errors with exit code 2."""

import json

from scalelab.cli.main import main
from scalelab.train.data.shards import PreparedSource
from scalelab.train.data.tokenizer import load_tokenizer


def test_data_cli_round_trip(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.md").write_text("hello scalelab data pipeline\n" * 50)
    (corpus / "b.txt").write_text("tokens bytes and bits per byte\n" * 50)
    (corpus / "skip.py").write_text("print('not matched by --patterns')\n")
    tok = tmp_path / "tok.json"
    assert main(["data", "tokenizer", "--vocab-size", "300", "--out", str(tok), str(corpus)]) == 0
    assert load_tokenizer(str(tok)).vocab_size <= 300
    out = tmp_path / "shards"
    argv = ["data", "prepare", str(corpus), "--out", str(out), "--tokenizer", str(tok)]
    assert main([*argv, "--val-fraction", "0.4", "--patterns", "*.md,*.txt"]) == 0
    src = PreparedSource(out)
    assert src.index["num_documents"] == 2 and src.index["tokenizer"] == str(tok.resolve())
    expected_bytes = sum(len((corpus / f).read_bytes()) for f in ("a.md", "b.txt"))
    assert src.num_bytes("train") + src.num_bytes("val") == expected_bytes
    capsys.readouterr()
    assert main(["data", "info", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["content_hash"] == src.index["content_hash"]
    assert main(["data", "info", str(out)]) == 0
    assert "bytes/token" in capsys.readouterr().out


def test_data_cli_errors_are_one_line(tmp_path, capsys):
    cases = [
        ["data", "prepare", str(tmp_path / "missing"), "--out", str(tmp_path / "o")],
        ["data", "info", str(tmp_path / "missing")],
        ["data", "info", str(tmp_path)],  # exists but is not a shard dir
        ["data", "tokenizer", "--vocab-size", "10", "--out", str(tmp_path / "t.json"), str(tmp_path)],
        ["data", "prepare", str(tmp_path), "--out", str(tmp_path / "o2"), "--tokenizer", "nope"],
    ]
    for argv in cases:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("scalelab data: error:") and "\n" not in err, err
