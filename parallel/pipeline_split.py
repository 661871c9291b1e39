"""Which blocks each pipeline stage holds and which stages each pipeline rank runs: arithmetic only.

    costs, first, last = layer_costs(model_cfg, seq_len)          # per-block cost, the ends' extra
    stages = split_layers(costs, num_stages, first, last)         # [[0, 1, 2], [3, 4], ...]
    stage_ids_for_rank(pp_rank, pp, schedule)                      # [r] or [r, r + pp] or the V's pair

scalelab.parallel.pipeline_parallel builds the stages from this split; the layout planner
(scalelab.parallel.planner_memory) counts each rank's parameters from it without importing
torch.distributed.pipelining.
"""

from __future__ import annotations

from scalelab.parallel.dims import stages_per_rank


def layer_costs(model_cfg, seq_len: int, balance: str = "flops") -> tuple[list[float], float, float]:
    """(per-block cost, extra cost of the first stage, extra cost of the last stage).

    flops: training FLOPs per token = 3 × forward (2 per multiply-add of every matrix, plus the
    causal attention scores/values, ~2·T·D per token); the embedding lookup costs ~0.
    params: parameter counts (the embedding on the first stage, norm + output on the last).
    """
    d, f, v = model_cfg.d_model, model_cfg.d_ff, model_cfg.vocab_size
    hd = model_cfg.head_dim
    attn_params = d * hd * (2 * model_cfg.num_heads + 2 * model_cfg.num_kv_heads)
    block_params = attn_params + 3 * d * f + 2 * d + (2 * hd if model_cfg.qk_norm else 0)
    if balance == "params":
        return [float(block_params)] * model_cfg.num_layers, float(v * d), float(v * d + d)
    block = 3.0 * (2 * (attn_params + 3 * d * f) + 2 * seq_len * d)
    return [block] * model_cfg.num_layers, 0.0, 3.0 * 2 * d * v


def split_layers(
    costs: list[float], num_stages: int, first_extra: float = 0.0, last_extra: float = 0.0
) -> list[list[int]]:
    """Contiguous partition of the blocks into `num_stages` non-empty stages minimising the max cost."""
    n = len(costs)
    if not 1 <= num_stages <= n:
        raise ValueError(f"cannot split {n} layers into {num_stages} stages")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)

    def cost(s: int, i: int, j: int) -> float:  # stage s holds blocks i..j-1
        return prefix[j] - prefix[i] + (first_extra if s == 0 else 0.0) + (last_extra if s == num_stages - 1 else 0.0)

    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]  # best[s][j]: first s stages cover j blocks
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for s in range(1, num_stages + 1):
        for j in range(s, n - (num_stages - s) + 1):
            for i in range(s - 1, j):
                value = max(best[s - 1][i], cost(s - 1, i, j))
                if value < best[s][j]:
                    best[s][j], cut[s][j] = value, i
    bounds, j = [], n
    for s in range(num_stages, 0, -1):
        i = cut[s][j]
        bounds.append(list(range(i, j)))
        j = i
    return bounds[::-1]


def stage_ids_for_rank(pp_rank: int, pp: int, schedule: str) -> list[int]:
    """The global stage indices this pipeline rank runs (loop style, or V style for zero-bubble)."""
    if stages_per_rank(schedule) == 1:
        return [pp_rank]
    if schedule == "zero-bubble":
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank, pp_rank + pp]


def rank_of_stage(stage: int, pp: int, schedule: str) -> int:
    for r in range(pp):
        if stage in stage_ids_for_rank(r, pp, schedule):
            return r
    raise ValueError(stage)
