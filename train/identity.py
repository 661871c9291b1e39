"""A run's identity: its id (the store's run_id), and the one answer to "is this the same run?".

    run_id = config_hash(cfg)                          # sha256 of the identity part of the config
    cfg = same_run(stored_tree, run_id)                # today's RunConfig of a stored run, or NotSameRun
    same_run(stored_tree, run_id, today=cfg)           # a config given now: the stored run's config?
    current_run_id(stored_tree, run_id)                # the id today's code gives a stored run, or None

The identity leaves out what does not change the numbers: the layout (scalelab parity checks that it
does not), logging and profiling; so a run resumes under another layout and a sweep never retrains
a finished run because the cluster shape changed. The parametrization's base-shape fields are left
out under sp (which ignores them), and `base_d_ff` at its default of 0 (which computes what runs
without the field computed), and so is `train.data_seed` while unset or equal to `train.seed`
(the data order follows `train.seed`, as before the field existed), so stores written before those
fields existed keep their ids.

The policy (one, used by the store's dedupe, the sweep trial, `scalelab run --resume` and the tests):
a stored run and today's config are the same run when
  1. today's code resolves the stored tree without changing any identity key it holds (fields the
     code gained since are allowed: their defaults compute what the stored run computed), and
  2. a config given now has the same identity as that resolution.
The stored id is a shortcut for 1: today's hash equal to it means nothing changed.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from scalelab.config_tree import to_dict
from scalelab.errors import UsageError
from scalelab.train.config import RunConfig, build_run_config

_NOT_IDENTITY = ("parallel", "logging", "profile")  # sections that do not change what a run computes
# The parametrization's model fields: under sp they do not change the numbers.
_NEUTRAL_MODEL_FIELDS = ("parametrization", "base_d_model", "base_num_layers", "base_head_dim", "base_d_ff")
# Left out at their default, which computes what runs stored without the field computed.
_ADDED_MODEL_DEFAULTS = {"base_d_ff": 0}
# The same, under any parametrization: the SwiGLU feed-forward and the whole train split every
# run stored before these fields existed computed.
_ADDED_ANY_MODEL_DEFAULTS = {"mlp": "swiglu"}
_ADDED_SOURCE_DEFAULTS = {"train_exclude": []}


class NotSameRun(UsageError, RuntimeError):
    """A stored run that today's code (or the config given) would compute differently.

    A UsageError (the CLI prints one line and exits 2) and a RuntimeError (a sweep trial fails)."""

    def __init__(self, message: str, path: str):
        super().__init__(message)
        self.path = path  # the first identity key that differs, e.g. "optim.lr"


def identity_tree(tree: dict[str, Any]) -> dict[str, Any]:
    """The part of a resolved config tree that identifies the run (see the module docstring)."""
    out = {k: v for k, v in tree.items() if k not in _NOT_IDENTITY}
    train = out.get("train")
    if isinstance(train, dict) and "data_seed" in train and train["data_seed"] in (None, train.get("seed", 0)):
        # the data order follows train.seed, as it did before the field existed
        out["train"] = {k: v for k, v in train.items() if k != "data_seed"}
    data = out.get("data")
    if isinstance(data, dict) and isinstance(data.get("sources"), list):
        out["data"] = dict(data, sources=[_drop_defaults(s, _ADDED_SOURCE_DEFAULTS) for s in data["sources"]])
    model = out.get("model")
    if not isinstance(model, dict):
        return out
    model = _drop_defaults(model, _ADDED_ANY_MODEL_DEFAULTS)
    if model.get("parametrization", "sp") == "sp":  # sp ignores the base shape
        out["model"] = {k: v for k, v in model.items() if k not in _NEUTRAL_MODEL_FIELDS}
    else:
        out["model"] = {
            k: v for k, v in model.items() if k not in _ADDED_MODEL_DEFAULTS or v != _ADDED_MODEL_DEFAULTS[k]
        }
    return out


def _drop_defaults(section: Any, defaults: dict[str, Any]) -> Any:
    """The section without the fields of `defaults` that are at their default value."""
    if not isinstance(section, dict):
        return section
    return {k: v for k, v in section.items() if k not in defaults or v != defaults[k]}


def identity_dict(cfg: RunConfig) -> dict[str, Any]:
    """The resolved config without the sections that do not change the numbers."""
    return identity_tree(to_dict(cfg))


def config_hash(cfg: RunConfig, length: int = 12) -> str:
    """Stable id of a resolved config (the store's run_id): sha256 of its canonical identity JSON."""
    blob = json.dumps(identity_dict(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def same_run(stored: dict[str, Any], run_id: str | None = None, *, today: RunConfig | None = None) -> RunConfig:
    """Today's RunConfig of the run stored as `stored` (with id run_id, if known); see the policy above.

    Args:
        stored: the run's config tree as the store keeps it (config.json, sweep.resolved.json).
        run_id: the id it was stored under (None: unknown, so rule 1 is checked key by key).
        today: a config given now for this run (`scalelab run --resume`); returned when it is the run.

    Raises:
        NotSameRun: naming the first identity key that differs.
        ConfigError: today's code rejects the stored tree.
    """
    resolved = build_run_config(stored)
    if run_id is None or config_hash(resolved) != run_id:
        diff = _first_change(_plain(identity_tree(stored)), _plain(identity_dict(resolved)), "")
        if diff:
            raise NotSameRun(
                f"run {run_id or '(stored)'}: today's code resolves its config differently at {diff}; "
                "launch the spec into a new sweep",
                diff,
            )
    if today is None:
        return resolved
    if config_hash(today) != config_hash(resolved):
        diff = _first_change(_plain(identity_dict(resolved)), _plain(identity_dict(today)), "") or "(a key it lacks)"
        raise NotSameRun(f"run {run_id or '(stored)'}: the config given differs from the stored one at {diff}", diff)
    return today


def current_run_id(stored: dict[str, Any], run_id: str) -> str | None:
    """The id today's code gives the run stored under run_id, or None when it computes another run
    (or rejects the stored config). What the store's dedupe matches renamed runs by."""
    try:
        return config_hash(same_run(stored, run_id))
    except Exception:  # noqa: BLE001 - a config today's code rejects (any error) matches nothing
        return None


def _plain(tree: dict[str, Any]) -> dict[str, Any]:
    """The tree as JSON would give it back (tuples as lists), as the hash sees it."""
    return json.loads(json.dumps(tree))


def _first_change(old: Any, new: Any, path: str) -> str | None:
    """The first key path of `old` whose value `new` changes or lacks (keys only in `new` are allowed)."""
    if isinstance(old, dict) and isinstance(new, dict):
        for k, v in old.items():
            key = f"{path}.{k}" if path else k
            hit = _first_change(v, new[k], key) if k in new else f"{key} (removed)"
            if hit:
                return hit
        return None
    return None if old == new else path
