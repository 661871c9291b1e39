"""Context parallel (all-gather KV and ring) vs one device on CPU/gloo (scalelab.parallel.context_parallel).

Causal attention with head-tail load balancing (alone, with FSDP over dp_shard x cp, with TP inside each
cp rank); the logits of every rank's rows, the loss and every
parameter gradient (FSDP over dp_shard x cp) must match one device within 1e-5 in fp32.
"""

from __future__ import annotations

import torch

from scalelab.parallel.context_parallel import local_positions, shard_sequence
from scalelab.parallel.cp_parity import CPSpec, cp_parity


def test_head_tail_sharding_covers_the_sequence_once():
    cp, seq_len = 4, 32
    pos = torch.cat([local_positions(seq_len, r, cp) for r in range(cp)])
    assert sorted(pos.tolist()) == list(range(seq_len))
    assert local_positions(seq_len, 0, cp).tolist() == [0, 1, 2, 3, 28, 29, 30, 31]
    # equal causal work per rank: sum of (position + 1) over the rows each rank holds
    work = [int((local_positions(seq_len, r, cp) + 1).sum()) for r in range(cp)]
    assert len(set(work)) == 1
    x = torch.arange(2 * seq_len).view(2, seq_len)
    assert torch.equal(shard_sequence(x, 1, cp), x[:, local_positions(seq_len, 1, cp)])


def _check(rows):
    for row in rows:
        assert row["max_logit_diff"] <= 1e-5 and row["loss_diff"] <= 1e-5 and row["max_grad_diff"] <= 1e-5, row


def test_cp_world2_allgather_and_ring():
    torch.set_num_threads(1)
    _check(cp_parity(["cp2", "cp2-ring"], CPSpec()))


def test_cp_world4_allgather_ring_fsdp_and_tp():
    torch.set_num_threads(1)
    _check(cp_parity(["cp4", "cp4-ring", "fsdp2xcp2", "tp2xcp2-ring"], CPSpec()))
