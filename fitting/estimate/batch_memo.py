"""The batched L-BFGS of a BatchObjective, solved once per process for each distinct problem.

A batched fit is a pure function of its problem: the law (its class and every field), the runs'
inputs, losses and weights, the objective (Huber delta, reduction), the starting points, the box, the
stopping rules and torch's thread count; lbfgs_batched on the same problem performs the same
operations on the same rows in the same order, so it returns the same bits. Within one process the
same problem comes back (one store's fit asked for by `sweep next`, the report and the plan; a
quarter of the calls in the test suite). The memo keys a problem by a SHA-256 digest of all of it,
keeps the last MEMO_SIZE results and hands out copies, so a caller that edits its arrays cannot
change what the next caller gets.

    res = solve(BatchObjective(law, x, loss), x0, lo, hi, max_iter=200)   # lbfgs_batched's arguments
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from scalelab.fitting.estimate.batched_lbfgs import BatchResult, lbfgs_batched
from scalelab.fitting.estimate.objective import BatchObjective

MEMO_SIZE = 256  # results kept (a 4500-start result is ~0.3 MB)
_MEMO: OrderedDict[str, BatchResult] = OrderedDict()


def _feed(h: Any, value: Any) -> None:
    """Hash `value` unambiguously: its type, then its content (arrays by dtype, shape and bytes)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        h.update(f"nd:{value.dtype.str}:{value.shape}:".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, (list, tuple)):
        h.update(f"{type(value).__name__}:{len(value)}:".encode())
        for item in value:
            _feed(h, item)
    elif isinstance(value, dict):
        h.update(f"dict:{len(value)}:".encode())
        for k in sorted(value, key=repr):
            _feed(h, k)
            _feed(h, value[k])
    elif value is None or isinstance(value, (bool, int, float, str)):
        h.update(f"{type(value).__name__}:{value!r};".encode())  # repr of a float is exact
    else:
        raise TypeError(f"cannot key a batched fit on a {type(value).__name__}")


def problem_key(obj: BatchObjective, x0: Any, lower: Any, upper: Any, options: dict[str, Any]) -> str:
    """The digest of everything lbfgs_batched's result on `obj` depends on."""
    h = hashlib.sha256()
    law = obj.law
    _feed(h, f"{type(law).__module__}.{type(law).__qualname__}")
    _feed(h, {f.name: getattr(law, f.name) for f in dataclasses.fields(law)})
    _feed(h, {k: obj.x[k] for k in law.inputs})
    for value in (obj.log_y, obj.weights, obj.objective, obj.delta, obj.reduction):
        _feed(h, value)
    for value in (x0, lower, upper):
        _feed(h, np.asarray(value, dtype=np.float64))
    _feed(h, dict(options))
    _feed(h, torch.get_num_threads())
    return h.hexdigest()


def solve(obj: BatchObjective, x0: Any, lower: Any, upper: Any, **options: Any) -> BatchResult:
    """lbfgs_batched(obj, x0, lower, upper, **options), or a copy of its result for the same problem
    earlier in this process (then n_fun_rows is 0: nothing was evaluated)."""
    try:
        key = problem_key(obj, x0, lower, upper, options)
    except TypeError:  # a law field the digest cannot read: solve it without the memo
        return lbfgs_batched(obj, x0, lower, upper, **options)
    if key in _MEMO:
        _MEMO.move_to_end(key)
        return _MEMO[key].copy(0)
    res = lbfgs_batched(obj, x0, lower, upper, **options)
    _MEMO[key] = res.copy(res.n_fun_rows)
    while len(_MEMO) > MEMO_SIZE:
        _MEMO.popitem(last=False)
    return res


def clear() -> None:
    """Forget every memoised result: a benchmark that times one fit more than once calls this first."""
    _MEMO.clear()
