"""MixtureSampler and validation sets: determinism, resume, DP chunking, exact mixture, epoch caps."""

import json
import math

import numpy as np
import pytest
import torch

from scalelab.errors import ConfigError, UsageError
from scalelab.train.data.bundle import build_data
from scalelab.train.data.config import DataConfig, SourceConfig
from scalelab.train.data.prepare import prepare
from scalelab.train.data.sampler import MixtureSampler, validation_batches
from scalelab.train.data.shards import PreparedSource
from scalelab.train.data.tokenizer import ByteTokenizer

SEQ = 16


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Three sources whose bytes tell them apart: letters, digits, punctuation."""
    root = tmp_path_factory.mktemp("mix")
    alphabets = {"letters": "abcdefghij", "digits": "0123456789", "punct": "!#$%&()*+,"}
    out = {}
    for k, (name, chars) in enumerate(alphabets.items()):
        folder = root / name
        folder.mkdir()
        rng = np.random.default_rng(k)
        for d in range(40 - 15 * k):  # 40, 25, 10 documents: different sizes
            text = "".join(rng.choice(list(chars), size=int(rng.integers(20, 200))))
            (folder / f"doc{d:02d}.txt").write_text(text)
        out[name] = prepare([folder], root / f"{name}-shards", "byte", val_fraction=0.1, name=name)
    return out


def _source_of(row: torch.Tensor) -> str:
    b = bytes(t for t in row.tolist() if t != 256).decode()
    kinds = {"letters" if c.isalpha() else "digits" if c.isdigit() else "punct" for c in b}
    assert len(kinds) == 1, b  # a window never mixes sources
    return kinds.pop()


def _sampler(srcs, weights=(1.0,), epochs=100.0, seed=0, rank=0, size=1):
    return MixtureSampler(srcs, list(weights), epochs, SEQ, seed, dp_rank=rank, dp_size=size)


def test_shapes_windows_and_determinism(sources):
    src = sources["letters"]
    a, b = _sampler([src]), _sampler([src])
    for _ in range(3):
        x = a.next_batch(8)
        assert x.dtype == torch.int64 and x.shape == (8, SEQ + 1)
        assert torch.equal(x, b.next_batch(8))
    # every row is a packed window of the train stream starting at a multiple of seq_len
    train = torch.from_numpy(np.asarray(src.train, dtype=np.int64))
    starts = set()
    for row in x:
        hits = [w for w in range(a.num_windows[0]) if torch.equal(train[w * SEQ : w * SEQ + SEQ + 1], row)]
        assert hits
        starts.add(hits[0])
    assert len(starts) == 8
    assert not torch.equal(_sampler([src], seed=1).next_batch(8), _sampler([src], seed=0).next_batch(8))


def test_one_epoch_visits_every_window_once(sources):
    src = sources["digits"]
    s = _sampler([src])
    w = s.num_windows[0]
    assert w == (src.num_tokens("train") - 1) // SEQ
    first = torch.cat([s.next_batch(1) for _ in range(w)])
    expected = np.stack([np.asarray(src.train[i * SEQ : i * SEQ + SEQ + 1], dtype=np.int64) for i in range(w)])
    assert sorted(map(tuple, first.tolist())) == sorted(map(tuple, expected.tolist()))
    second = torch.cat([s.next_batch(1) for _ in range(w)])
    assert sorted(map(tuple, second.tolist())) == sorted(map(tuple, expected.tolist()))
    assert not torch.equal(first, second)  # a fresh permutation per epoch


def test_resume_from_state_is_exact(sources):
    srcs = [sources["letters"], sources["digits"]]
    ref = _sampler(srcs, weights=(2, 1))
    for _ in range(5):
        ref.next_batch(12)
    state = json.loads(json.dumps(ref.state_dict()))
    resumed = _sampler(srcs, weights=(2, 1))
    resumed.load_state_dict(state)
    for _ in range(5):
        assert torch.equal(ref.next_batch(12), resumed.next_batch(12))
    # a state from other data is refused
    other = _sampler([sources["punct"], sources["digits"]], weights=(2, 1))
    with pytest.raises(UsageError, match="source_names"):
        other.load_state_dict(state)


@pytest.mark.parametrize("dp_size", [2, 4])
def test_dp_ranks_concatenate_to_single_process(sources, dp_size):
    srcs = [sources["letters"], sources["digits"], sources["punct"]]
    weights = (0.5, 0.3, 0.2)
    single = _sampler(srcs, weights)
    ranks = [_sampler(srcs, weights, rank=r, size=dp_size) for r in range(dp_size)]
    for _ in range(6):
        full = single.next_batch(20)
        parts = [r.next_batch(20) for r in ranks]
        assert all(p.shape == (20 // dp_size, SEQ + 1) for p in parts)
        assert torch.equal(torch.cat(parts), full)
    assert all(r.state_dict() == single.state_dict() for r in ranks)
    with pytest.raises(ValueError, match="dp_size"):
        ranks[0].next_batch(21 if dp_size == 2 else 22)


def test_resume_on_a_different_dp_size(sources):
    srcs = [sources["letters"], sources["digits"]]
    single = _sampler(srcs, (3, 1))
    for _ in range(4):
        single.next_batch(8)
    state = single.state_dict()
    ranks = [_sampler(srcs, (3, 1), rank=r, size=4) for r in range(4)]
    for r in ranks:
        r.load_state_dict(state)
    for _ in range(3):
        assert torch.equal(torch.cat([r.next_batch(8) for r in ranks]), single.next_batch(8))


@pytest.mark.parametrize("weights", [(3, 1, 0), (0.2, 0.3, 0.5), (1, 1, 1), (0.7, 0.2, 0.1)])
def test_mixture_proportions_exact(sources, weights):
    names = ["letters", "digits", "punct"][: sum(1 for w in weights if w)]
    weights = [w for w in weights if w]
    s = _sampler([sources[n] for n in names], weights)
    total = sum(weights)
    seen = {n: 0 for n in names}
    for step in range(1, 31):
        for row in s.next_batch(10):
            seen[_source_of(row)] += 1
        n = 10 * step
        assert [seen[k] for k in names] == s.source_counts  # content agrees with the bookkeeping
        for k, w in zip(names, weights):
            target = n * w / total
            assert abs(seen[k] - target) < 1
            if math.isclose(target, round(target)):
                assert seen[k] == round(target)


def test_max_epochs_budget_and_error(sources):
    srcs = [sources["letters"], sources["punct"]]
    s = _sampler(srcs, (1, 1), epochs=1.0)
    cap = s.capacity_samples()
    assert cap == min(s.num_windows) * 2 and s.capacity_tokens() == cap * SEQ
    s.check_budget(s.capacity_tokens())
    with pytest.raises(ConfigError) as e:
        s.check_budget(s.capacity_tokens() + 1)
    assert e.value.key == "data.sources[1].max_epochs" and "max_epochs" in str(e.value)
    for _ in range(cap):
        s.next_batch(1)  # the whole capacity can be drawn
    with pytest.raises(ConfigError) as e:
        for _ in range(4):
            s.next_batch(1)
    assert e.value.key == "data.sources[1].max_epochs" and "exhausted" in str(e.value)
    # a failed batch does not advance the state
    state = s.state_dict()
    with pytest.raises(ConfigError):
        s.next_batch(8)
    assert s.state_dict() == state


def test_validation_batches_fixed_and_bytes_exact(sources):
    src = sources["letters"]
    lengths = ByteTokenizer().token_byte_lengths()
    a = validation_batches(src, SEQ, 10, 4, lengths)
    b = validation_batches(src, SEQ, 10, 4, lengths)
    assert [t.shape[0] for t in a] == [4, 4, 2] and a.num_sequences == 10
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    first = torch.from_numpy(np.asarray(src.val[: SEQ + 1], dtype=np.int64))
    assert torch.equal(a.batches[0][0], first)
    targets = torch.cat(a.batches)[:, 1:]
    assert a.num_target_tokens == targets.numel()
    assert a.num_target_bytes == int((targets != 256).sum())
    assert a.bpb(1.0) == pytest.approx(targets.numel() / (a.num_target_bytes * math.log(2)))
    many = validation_batches(src, SEQ, 10_000, 64)  # capped by the val split; average bytes/token
    assert many.num_sequences == (src.num_tokens("val") - 1) // SEQ
    with pytest.raises(UsageError, match="val tokens"):
        validation_batches(src, src.num_tokens("val"), 1, 1)


def test_build_data_and_config_errors(sources, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "r.txt").write_text("\n".join(f"raw line {i}" for i in range(2000)))  # 1% val ~ 270 bytes
    cfg = DataConfig(
        seq_len=SEQ,
        val_sequences=4,
        sources=[
            SourceConfig(name="shards", path=str(sources["digits"].path), weight=1.0),
            SourceConfig(name="raw", path=str(raw), weight=3.0),
        ],
    )
    bundle = build_data(cfg, seed=0, dp_rank=1, dp_size=2, cache_dir=tmp_path / "cache")
    assert [s.name for s in bundle.sources] == ["shards", "raw"]
    assert bundle.sources[1].path.parent == tmp_path / "cache"
    assert bundle.sampler.next_batch(8).shape == (4, SEQ + 1)
    assert [v.num_sequences for v in bundle.val_sets] == [4, 4]

    def bad(key, **changes):
        c = DataConfig(seq_len=SEQ, sources=[SourceConfig(path=str(raw))])
        for k, v in changes.items():
            setattr(c.sources[0] if k in SourceConfig.__slots__ else c, k, v)
        with pytest.raises(ConfigError) as e:
            build_data(c, seed=0, cache_dir=tmp_path / "cache")
        assert e.value.key == key, str(e.value)

    bad("data.sources[0].path", path=str(tmp_path / "nope"))
    bad("data.sources[0].weight", weight=0.0)
    bad("data.sources[0].max_epochs", max_epochs=-1.0)
    bad("data.seq_len", seq_len=0)
    bad("data.tokenizer", tokenizer="gpt-7")
    bad("data.sources[0].path", seq_len=100_000)  # source shorter than one window
    bad("data.sources", sources=[])
    dup = DataConfig(sources=[SourceConfig(name="a"), SourceConfig(name="a")])
    with pytest.raises(ConfigError) as e:
        dup.validate("data")
    assert e.value.key == "data.sources[1].name"
    DataConfig().validate("data")  # the default config is valid


@pytest.mark.parametrize("weights", [(9, 9, 0.1, 0.9, 4), (8, 8, 0.77, 0.27, 0.31, 9), (0.5, 0.25, 0.25)])
def test_mixture_discrepancy_below_one_sample(sources, weights):
    """|count_s - n*w_s| < 1 after every sample, for mixtures where the plain largest-deficit rule
    falls a whole sample behind (the first two, at n = 92 and n = 53)."""
    dirs = [sources[k].path for k in ("letters", "digits", "punct")]
    srcs = [PreparedSource(dirs[i % 3], name=f"s{i}") for i in range(len(weights))]
    s = _sampler(srcs, weights)
    total = sum(weights)
    for n in range(1, 301):
        s.next_batch(1)
        for c, w in zip(s.source_counts, weights):
            assert abs(c - n * w / total) < 1, (n, s.source_counts)


def test_unique_tokens_cap_repeats_only_the_first_tokens(sources):
    """Data-constrained runs: a cap of U tokens means every window lies in the first U tokens and
    the run repeats them; the epoch budget counts against the cap."""
    src = sources["letters"]
    seq_len = 16
    cap = 20 * seq_len + 1  # exactly 20 windows
    s = MixtureSampler([src], [1.0], [3.0], seq_len, seed=0, unique_tokens=[cap])
    assert s.num_windows == [20]
    first = np.asarray(src.train[:cap], dtype=np.int64)
    starts = set()
    for _ in range(60 // 4):  # 3 epochs of 20 windows, 4 per batch
        for row in s.next_batch(4).numpy():
            hits = [i for i in range(0, cap - seq_len, seq_len) if np.array_equal(first[i : i + seq_len + 1], row)]
            assert hits, "a window came from beyond the unique-token cap"
            starts.add(hits[0])
    assert len(starts) == 20  # every window of the capped prefix seen (3 times each)
    with pytest.raises(ConfigError, match="max_epochs"):
        s.check_budget(61 * seq_len)
    with pytest.raises(ConfigError, match="unique_tokens"):
        MixtureSampler([src], [1.0], [3.0], seq_len, seed=0, unique_tokens=[10**12])
