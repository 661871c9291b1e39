"""Run config: YAML + overrides into a typed tree; bad input names the key and the fix."""

import json

import pytest

from scalelab.config_tree import apply_overrides
from scalelab.errors import ConfigError
from scalelab.train.config import build_run_config, load_run_config, to_dict

BASE = {
    "model": {"preset": "debug"},
    "data": {"seq_len": 32},
    "train": {"num_tokens": 4096, "global_batch_tokens": 256},
}


def test_preset_and_overrides_resolve():
    cfg = build_run_config(BASE, ["model.d_model=128", "optim.lr=1e-3", "schedule.name=wsd"])
    assert cfg.model.d_model == 128
    assert cfg.optim.lr == 1e-3 and isinstance(cfg.optim.lr, float)
    assert cfg.schedule.name == "wsd"
    assert cfg.model.vocab_size == 320  # byte tokenizer 257 padded up to a multiple of 64
    assert cfg.global_batch_sequences == 8 and cfg.num_steps == 16


def test_resolved_json_round_trips(tmp_path):
    cfg = build_run_config(BASE, ["data.sources.0.weight=2.0", "tags.arch=base"])
    path = tmp_path / "config.json"
    path.write_text(json.dumps(to_dict(cfg)))
    again = load_run_config(str(path))
    assert to_dict(again) == to_dict(cfg)
    assert again.data.sources[0].weight == 2.0 and again.tags == {"arch": "base"}


@pytest.mark.parametrize(
    "override, key",
    [
        ("model.d_modl=64", "model.d_modl"),  # unknown key (with a suggestion)
        ("optim.lr=fast", "optim.lr"),  # wrong type
        ("model.num_heads=3", "model"),  # d_model not divisible by heads
        ("train.global_batch_tokens=16", "train.global_batch_tokens"),  # less than one sequence
        ("train.micro_batch_sequences=3", "train.micro_batch_sequences"),
        ("schedule.name=step", "schedule.name"),
        ("data.sources.0.path=/no/such/dir", "data.sources"),
        ("data.seq_len=100000", "data.seq_len"),
        ("bogus.key=1", "bogus"),
    ],
)
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as e:
        build_run_config(BASE, [override])
    assert str(e.value).startswith(key), str(e.value)
    assert "\n" not in str(e.value)


def test_unknown_key_suggests_the_close_one():
    with pytest.raises(ConfigError, match="did you mean 'd_model'"):
        build_run_config(BASE, ["model.d_modl=64"])


def test_override_syntax_errors():
    with pytest.raises(ConfigError, match="key.path=value"):
        apply_overrides({}, ["optim.lr"])
    with pytest.raises(ConfigError, match="out of range"):
        apply_overrides({"a": [1]}, ["a.3=2"])


def test_missing_config_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_run_config(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_run_config(str(bad))


def test_relative_data_paths_are_resolved(tmp_path, monkeypatch):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("hello world\n" * 200)
    monkeypatch.chdir(tmp_path)
    cfg = build_run_config(BASE, ["data.sources.0.path=corpus"])
    assert cfg.data.sources[0].path == str(tmp_path / "corpus")


def test_layout_and_logging_are_not_part_of_the_run_identity():
    from scalelab.train.identity import config_hash

    base = build_run_config(BASE)
    assert config_hash(base) == config_hash(build_run_config(BASE, ["parallel.dp_shard=2", "logging.wandb=online"]))
    assert config_hash(base) != config_hash(build_run_config(BASE, ["optim.lr=1e-4"]))


def test_yaml_on_off_switches_are_accepted_for_progress(tmp_path):
    """YAML 1.1 reads `off`/`on` as booleans: `logging: {progress: off}` must mean "off"."""
    path = tmp_path / "run.yaml"
    path.write_text("model: {preset: debug}\ndata: {seq_len: 32}\nlogging: {progress: off}\n")
    assert load_run_config(str(path)).logging.progress == "off"
    assert build_run_config(BASE, ["logging.progress=on"]).logging.progress == "on"
    with pytest.raises(ConfigError, match="logging.progress"):
        build_run_config(BASE, ["logging.progress=sometimes"])


def test_explicit_model_without_max_seq_len_takes_data_seq_len():
    model = {"vocab_size": 320, "num_layers": 2, "d_model": 64, "num_heads": 4, "num_kv_heads": 2, "d_ff": 128}
    cfg = build_run_config({**BASE, "model": model, "data": {"seq_len": 64}})
    assert cfg.model.max_seq_len == 64
    given = build_run_config({**BASE, "model": {**model, "max_seq_len": 96}, "data": {"seq_len": 64}})
    assert given.model.max_seq_len == 96  # an explicit value is kept
