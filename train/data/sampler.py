"""Deterministic, resumable, data-parallel-aware sampling of packed sequences from a source mixture.

    sampler = MixtureSampler([src_a, src_b], weights=[3, 1], max_epochs=[4, 4], seq_len=256, seed=0,
                             dp_rank=rank, dp_size=world)
    sampler.check_budget(num_tokens)             # ConfigError naming data.sources[i].max_epochs
    x = sampler.next_batch(64)                   # LongTensor [64 // world, 257]: this rank's rows
    inputs, targets = x[:, :-1], x[:, 1:]
    state = sampler.state_dict()                 # JSON-serialisable; load_state_dict resumes exactly

Packing (nanoGPT / Megatron): a source's train split is one token stream with end-of-text between
documents; window w is tokens [w*seq_len, w*seq_len + seq_len + 1), so inputs never overlap and
every token is a target exactly once per epoch (num_windows = (num_tokens - 1) // seq_len).
Epoch e of a source visits its windows in a permutation seeded by (seed, source name, e).

Mixture: global sample n goes to a source by Tijdeman's chairman-assignment rule (a deficit rule,
see `_tijdeman_choice`) in exact integer arithmetic on the weights as fractions. After n samples
|count_s - n*w_s| <= 1 - 1/(2S-2) < 1, so count_s == n*w_s exactly whenever that is an integer:
exact proportions, no random state. (The plain largest-deficit rule can fall behind by more than
one sample with three or more sources.) The k-th sample drawn from a source is window
perm_{k // W}[k % W].

Data parallelism: with G sequences per step, step t covers global samples [t*G, (t+1)*G) and rank
r gets rows [r*G/W, (r+1)*G/W); every rank advances the (cheap, integer) mixture schedule over all
G samples but reads only its rows, so the ranks' batches concatenated equal the single-process
batch. The state is global (samples seen, per-source counts), so a run may resume on a different
number of ranks.

Validation: `validation_batches` takes windows spread evenly over a source's val split — fixed, the
same on every call and rank — and counts the UTF-8 bytes behind their targets for bits per byte.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import torch

from scalelab.errors import ConfigError, UsageError
from scalelab.train.data.shards import PreparedSource


def _name_seed(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big")


def _integer_weights(weights: Sequence[float]) -> list[int]:
    """Weights as integers with the same ratios (each rounded to a fraction with denominator <= 1e6)."""
    fracs = [Fraction(w).limit_denominator(1_000_000) for w in weights]
    lcm = math.lcm(*(f.denominator for f in fracs))
    parts = [int(f * lcm) for f in fracs]
    g = math.gcd(*parts)
    return [p // g for p in parts]


def _tijdeman_choice(n: int, counts: Sequence[int], parts: Sequence[int], total: int) -> int:
    """Source of global sample n (1-based) by Tijdeman's chairman-assignment rule, in integers.

    With weights w_j = parts[j] / total and S sources, D = 2S - 2: among the sources whose deficit
    n*w_j - counts[j] is at least 1/D, take the one whose next sample is most overdue, i.e. the
    smallest (counts[j] + 1 - 1/D) / w_j; ties go to the lower index. This keeps
    |counts[j] - n*w_j| <= 1 - 1/D < 1 for every n and j (R. Tijdeman, 1980).
    """
    num = len(parts)
    if num == 1:
        return 0
    d = 2 * num - 2
    best, best_key = -1, (0, 1)
    for j in range(num):
        if d * (n * parts[j] - counts[j] * total) < total:
            continue  # deficit below 1/D: not eligible yet (at least one source always is)
        key = (d - 1 + d * counts[j], parts[j])  # the fraction key[0] / key[1], compared exactly
        if best < 0 or key[0] * best_key[1] < best_key[0] * key[1]:
            best, best_key = j, key
    return best


class MixtureSampler:
    """Batches of packed windows (seq_len + 1 tokens) drawn from weighted sources; see module doc."""

    def __init__(
        self,
        sources: Sequence[PreparedSource],
        weights: Sequence[float],
        max_epochs: Sequence[float] | float,
        seq_len: int,
        seed: int,
        dp_rank: int = 0,
        dp_size: int = 1,
        unique_tokens: Sequence[int] | None = None,
    ) -> None:
        if not sources:
            raise ConfigError("data.sources", "is empty", "add at least one source")
        if isinstance(max_epochs, int | float):
            max_epochs = [float(max_epochs)] * len(sources)
        if len(weights) != len(sources) or len(max_epochs) != len(sources):
            raise ValueError(f"{len(sources)} sources but {len(weights)} weights, {len(max_epochs)} max_epochs")
        if seq_len < 1:
            raise ConfigError("data.seq_len", f"{seq_len} must be >= 1", "e.g. 256")
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank={dp_rank} is not in [0, dp_size={dp_size})")
        for i, w in enumerate(weights):
            if not (math.isfinite(w) and w > 0):
                raise ConfigError(f"data.sources[{i}].weight", f"{w} must be a finite number > 0", "e.g. 1.0")
        names = [s.name for s in sources]
        if len(set(names)) != len(names):
            raise ConfigError("data.sources", f"duplicate source names {names}", "give every source a distinct name")
        self.sources = list(sources)
        self.names = names
        self.seq_len = int(seq_len)
        self.seed = int(seed)
        self.dp_rank, self.dp_size = int(dp_rank), int(dp_size)
        self.weights = [float(w) for w in weights]
        self.max_epochs = [float(m) for m in max_epochs]
        self._parts = _integer_weights(self.weights)
        self._parts_total = sum(self._parts)
        self.num_windows = [max(0, (s.num_tokens("train") - 1) // self.seq_len) for s in self.sources]
        for i, cap in enumerate(unique_tokens or []):
            if cap > 0:  # data-constrained: only the first `cap` tokens (whole windows) are ever seen
                if cap // self.seq_len > self.num_windows[i]:
                    raise ConfigError(
                        f"data.sources[{i}].unique_tokens",
                        f"{cap:,} exceeds the {self.num_windows[i] * self.seq_len:,} train tokens of "
                        f"source {names[i]!r}",
                        "lower it or add data",
                    )
                self.num_windows[i] = max(1, (cap - 1) // self.seq_len)
        for i, (s, w) in enumerate(zip(self.sources, self.num_windows)):
            if w == 0:
                raise ConfigError(
                    f"data.sources[{i}].path",
                    f"source {s.name!r} has {s.num_tokens('train')} train tokens, "
                    f"fewer than seq_len + 1 = {self.seq_len + 1}",
                    "lower data.seq_len or add data",
                )
        # Samples each source may supply before passing max_epochs.
        self.max_samples = [int(m * w) for m, w in zip(self.max_epochs, self.num_windows)]
        self._counts = [0] * len(self.sources)
        self._samples_seen = 0
        self._perms: dict[tuple[int, int], np.ndarray] = {}

    # --- budget -----------------------------------------------------------------------------
    def capacity_samples(self) -> int:
        """Global samples the mixture can supply with no source past its max_epochs."""
        # count_s(n) <= ceil(n * p_s / P), so n <= max_samples_s * P / p_s keeps source s in budget.
        return min(m * self._parts_total // p for m, p in zip(self.max_samples, self._parts))

    def capacity_tokens(self) -> int:
        """Training tokens (targets) the mixture can supply: capacity_samples() * seq_len."""
        return self.capacity_samples() * self.seq_len

    def check_budget(self, num_tokens: int) -> None:
        """Raise ConfigError naming data.sources[i].max_epochs if `num_tokens` would exceed it."""
        needed = -(-int(num_tokens) // self.seq_len)
        if needed <= self.capacity_samples():
            return
        limits = [m * self._parts_total // p for m, p in zip(self.max_samples, self._parts)]
        i = int(np.argmin(limits))
        epochs = needed * self._parts[i] / self._parts_total / self.num_windows[i]
        raise ConfigError(
            f"data.sources[{i}].max_epochs",
            f"{num_tokens:,} training tokens need {epochs:.2f} epochs of source {self.names[i]!r} "
            f"({self.num_windows[i] * self.seq_len:,} train tokens at weight {self.weights[i]:g}), "
            f"more than max_epochs={self.max_epochs[i]:g}; "
            f"the mixture holds {self.capacity_tokens():,} tokens",
            f"raise data.sources[{i}].max_epochs to at least {math.ceil(epochs * 100) / 100:g}, "
            "lower train.num_tokens, or add data",
        )

    # --- sampling ---------------------------------------------------------------------------
    @property
    def samples_seen(self) -> int:
        """Global samples (sequences, all ranks) drawn so far."""
        return self._samples_seen

    @property
    def source_counts(self) -> list[int]:
        return list(self._counts)

    def _assign(self, num_samples: int) -> tuple[list[tuple[int, int]], list[int]]:
        """(source, k-th sample of that source) for the next global samples, and the new counts."""
        counts = list(self._counts)
        n, parts, total = self._samples_seen, self._parts, self._parts_total
        out: list[tuple[int, int]] = []
        for _ in range(num_samples):
            n += 1
            s = _tijdeman_choice(n, counts, parts, total)
            if counts[s] >= self.max_samples[s]:
                raise ConfigError(
                    f"data.sources[{s}].max_epochs",
                    f"source {self.names[s]!r} is exhausted after {counts[s]:,} sequences "
                    f"({self.max_epochs[s]:g} epochs of {self.num_windows[s]:,} windows)",
                    f"raise data.sources[{s}].max_epochs, lower train.num_tokens, or add data",
                )
            out.append((s, counts[s]))
            counts[s] += 1
        return out, counts

    def _perm(self, s: int, epoch: int) -> np.ndarray:
        key = (s, epoch)
        if key not in self._perms:
            ss = np.random.SeedSequence([self.seed % (1 << 64), _name_seed(self.names[s]), epoch])
            self._perms[key] = np.random.default_rng(ss).permutation(self.num_windows[s])
            for old in [k for k in self._perms if k[0] == s and k[1] < epoch - 1]:
                del self._perms[old]  # a batch spans at most two epochs of a source
        return self._perms[key]

    def window(self, s: int, k: int) -> np.ndarray:
        """The k-th window drawn from source s: seq_len + 1 tokens as int64."""
        epoch, j = divmod(k, self.num_windows[s])
        start = int(self._perm(s, epoch)[j]) * self.seq_len
        return np.asarray(self.sources[s].train[start : start + self.seq_len + 1], dtype=np.int64)

    def next_batch(self, global_batch_sequences: int) -> torch.Tensor:
        """This rank's rows of the next global batch: LongTensor [G // dp_size, seq_len + 1]."""
        g = int(global_batch_sequences)
        if g < 1 or g % self.dp_size:
            raise ValueError(f"global batch of {g} sequences does not split over dp_size={self.dp_size}")
        assignment, counts = self._assign(g)
        lo, hi = self.dp_rank * g // self.dp_size, (self.dp_rank + 1) * g // self.dp_size
        rows = np.stack([self.window(s, k) for s, k in assignment[lo:hi]])
        self._counts, self._samples_seen = counts, self._samples_seen + g
        return torch.from_numpy(rows)

    def batch_sources(self, global_batch_sequences: int) -> list[int]:
        """Source index of each global sample of the next batch, without advancing the sampler."""
        return [s for s, _ in self._assign(global_batch_sequences)[0]]

    # --- resume -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Plain JSON-serialisable state; independent of dp_rank/dp_size."""
        return {
            "samples_seen": self._samples_seen,
            "source_counts": list(self._counts),
            "source_names": list(self.names),
            "num_windows": list(self.num_windows),
            "seq_len": self.seq_len,
            "seed": self.seed,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly where `state` left off; UsageError if the data or settings changed."""
        for key, mine in (
            ("source_names", self.names),
            ("num_windows", self.num_windows),
            ("seq_len", self.seq_len),
            ("seed", self.seed),
        ):
            if state.get(key) != mine:
                raise UsageError(
                    f"sampler state has {key}={state.get(key)!r} but this run has {mine!r}; resume with "
                    "the same data sources, seq_len and seed"
                )
        counts = [int(c) for c in state["source_counts"]]
        if sum(counts) != int(state["samples_seen"]):
            raise UsageError("sampler state is inconsistent: source_counts do not sum to samples_seen")
        self._counts, self._samples_seen = counts, int(state["samples_seen"])


@dataclass(slots=True)
class ValSet:
    """Fixed held-out batches of one source, with the byte count behind their targets."""

    name: str
    batches: list[torch.Tensor] = field(repr=False)  # each LongTensor [<= batch_size, seq_len + 1]
    num_sequences: int
    num_target_tokens: int  # num_sequences * seq_len
    num_target_bytes: int  # UTF-8 bytes those target tokens stand for (end-of-text counts 0)

    @property
    def bytes_per_token(self) -> float:
        return self.num_target_bytes / self.num_target_tokens

    def bpb(self, mean_loss_nats: float) -> float:
        """Bits per byte from the mean cross-entropy (nats/token) over these targets."""
        return mean_loss_nats * self.num_target_tokens / (self.num_target_bytes * math.log(2))

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def validation_batches(
    source: PreparedSource,
    seq_len: int,
    num_sequences: int,
    batch_size: int,
    token_byte_lengths: np.ndarray | None = None,
) -> ValSet:
    """min(num_sequences, available) windows of the val split spread evenly over it, in batches.

    Evenly spaced rather than the first ones: the split is a handful of whole documents, and a
    validation loss over the first few of them measures those documents, not the model.

    token_byte_lengths (from Tokenizer.token_byte_lengths()) makes the byte count exact for these
    windows; without it the split's average bytes per token is used. UsageError when the val split
    holds less than one window.
    """
    if batch_size < 1 or num_sequences < 1:
        raise ValueError(f"batch_size={batch_size} and num_sequences={num_sequences} must be >= 1")
    available = max(0, (source.num_tokens("val") - 1) // seq_len)
    n = min(num_sequences, available)
    if n == 0:
        raise UsageError(
            f"source {source.name!r} has {source.num_tokens('val')} val tokens, fewer than seq_len + 1 = "
            f"{seq_len + 1}; prepare it with a larger val fraction or set data.val_sequences=0"
        )
    picks = np.unique(np.round(np.linspace(0, available - 1, n)).astype(np.int64))
    val = source.val
    windows = np.stack([np.asarray(val[w * seq_len : w * seq_len + seq_len + 1], dtype=np.int64) for w in picks])
    n = len(picks)
    if token_byte_lengths is not None:
        num_bytes = int(token_byte_lengths[windows[:, 1:]].sum())
    else:
        num_bytes = int(round(n * seq_len * source.bytes_per_token("val")))
    batches = [torch.from_numpy(windows[i : i + batch_size].copy()) for i in range(0, n, batch_size)]
    return ValSet(
        name=source.name,
        batches=batches,
        num_sequences=n,
        num_target_tokens=n * seq_len,
        num_target_bytes=num_bytes,
    )
