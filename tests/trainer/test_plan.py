"""The packing plan and the equalize arithmetic: pure functions over document lengths."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ft_trainer.planning.equalize import equalized_count, whole_steps
from ft_trainer.planning.plan import (
    PackingParams,
    build_epoch_plan,
    epoch_order,
    plan_fingerprint,
    split_by_tokens,
)


def params(**kw: int | bool) -> PackingParams:
    base = {"seq_len": 16, "micro_batch": 2, "grad_accum": 3, "world_size": 4, "seed": 7, "equalize": True}
    return PackingParams(**(base | kw))  # type: ignore[arg-type]


@given(
    lengths=st.lists(st.integers(0, 500), min_size=0, max_size=300),
    world=st.integers(1, 17),
)
@settings(max_examples=200, deadline=None)
def test_split_is_contiguous_complete_and_token_balanced(lengths: list[int], world: int) -> None:
    lens = np.asarray(lengths, dtype=np.int64)
    bounds = split_by_tokens(lens, world)
    assert bounds.shape == (world + 1,)
    assert bounds[0] == 0 and bounds[-1] == lens.size
    assert np.all(np.diff(bounds) >= 0)
    total = int(lens.sum())
    cum = np.concatenate(([0], np.cumsum(lens)))
    rank_tokens = cum[bounds[1:]] - cum[bounds[:-1]]
    longest = int(lens.max()) if lens.size else 0
    # each rank is within one document of its equal share (half a document at either edge)
    assert np.all(np.abs(rank_tokens - total / world) <= longest + 1e-9)
    # midpoint rule: every document's midpoint lies in its rank's share (the last share is closed, for
    # empty documents at the very end)
    for r in range(world):
        for i in range(bounds[r], bounds[r + 1]):
            mid = cum[i] + lens[i] / 2
            lo, hi = r * total / world, (r + 1) * total / world
            assert total == 0 or lo <= mid < hi or (r == world - 1 and mid == hi)


@given(
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=400),
    world=st.integers(1, 8),
    micro=st.integers(1, 3),
    accum=st.integers(1, 4),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 5),
)
@settings(max_examples=150, deadline=None)
def test_plan_counts_follow_the_documented_arithmetic(
    lengths: list[int], world: int, micro: int, accum: int, seed: int, epoch: int
) -> None:
    lens = np.asarray(lengths, dtype=np.int64)
    p_on = build_epoch_plan(
        lens, params(world_size=world, micro_batch=micro, grad_accum=accum, seed=seed), epoch
    )
    assert sorted(p_on.order.tolist()) == list(range(lens.size))  # a permutation
    assert int(p_on.rank_tokens.sum()) == int(lens.sum())
    expect_local = (p_on.rank_tokens // 16) // micro
    assert np.array_equal(p_on.local_micro_batches, expect_local)
    # equalize on: every rank the same count, the global minimum rounded down to whole steps
    assert p_on.balanced
    assert int(p_on.micro_batches[0]) == (int(expect_local.min()) // accum) * accum
    assert np.all(p_on.used_tokens <= p_on.rank_tokens)
    # equalize off: each rank its own count rounded down to whole steps; same assignment of documents
    p_off = build_epoch_plan(
        lens, params(world_size=world, micro_batch=micro, grad_accum=accum, seed=seed, equalize=False), epoch
    )
    assert np.array_equal(p_off.bounds, p_on.bounds) and np.array_equal(p_off.order, p_on.order)
    assert np.array_equal(p_off.micro_batches, (expect_local // accum) * accum)
    assert p_off.balanced == (len(set(((expect_local // accum) * accum).tolist())) == 1)


def test_plan_is_deterministic_per_seed_and_epoch() -> None:
    lens = np.random.default_rng(0).integers(1, 200, 5000)
    a = build_epoch_plan(lens, params(), 1)
    b = build_epoch_plan(lens.copy(), params(), 1)
    assert np.array_equal(a.order, b.order) and np.array_equal(a.bounds, b.bounds)
    assert plan_fingerprint([a]) == plan_fingerprint([b])
    c = build_epoch_plan(lens, params(), 2)
    assert not np.array_equal(a.order, c.order)  # reshuffled every epoch
    d = build_epoch_plan(lens, params(seed=8), 1)
    assert not np.array_equal(a.order, d.order)
    assert plan_fingerprint([a]) != plan_fingerprint([c]) != plan_fingerprint([d])
    # the order is pinned: a silent change of the shuffle would change every running job's data order
    assert epoch_order(10, seed=7, epoch=1).tolist() == epoch_order(10, seed=7, epoch=1).tolist()


def test_imbalanced_documents_give_unequal_counts_without_equalize() -> None:
    # 40 short documents and one 300-token document: whichever rank gets it packs far more blocks
    lens = np.array([10] * 40 + [300], dtype=np.int64)
    p = build_epoch_plan(lens, params(world_size=2, micro_batch=1, grad_accum=1, equalize=False), 0)
    assert not p.balanced
    assert int(p.micro_batches.max() - p.micro_batches.min()) >= 1
    q = build_epoch_plan(lens, params(world_size=2, micro_batch=1, grad_accum=1, equalize=True), 0)
    assert q.balanced and int(q.micro_batches[0]) == int(p.micro_batches.min())
    assert int(q.equalize_dropped_tokens.sum()) == int((p.micro_batches - q.micro_batches).sum()) * 16


def test_equalize_arithmetic() -> None:
    assert equalized_count(311, 1) == 311
    assert equalized_count(311, 8) == 304
    assert equalized_count(7, 8) == 0
    assert whole_steps(np.array([311, 312, 16]), 8).tolist() == [304, 312, 16]
    with pytest.raises(ValueError):
        equalized_count(5, 0)
    with pytest.raises(ValueError):
        equalized_count(-1, 2)


def test_billion_token_plan_for_16_ranks_is_balanced() -> None:
    """1.5 M documents (a billion tokens) on 16 ranks: equalized and non-empty. Its speed is a budget,
    measured by `make bench` (benchmarks/bench_gate.py: the whole gate process), not asserted here."""
    rng = np.random.default_rng(0)
    lens = np.clip(rng.lognormal(np.log(400), 1.0, 1_500_000), 8, 32768).astype(np.int64)
    assert 0.9e9 < lens.sum() < 1.1e9
    p = PackingParams(seq_len=4096, micro_batch=1, grad_accum=8, world_size=16, seed=1234, equalize=True)
    plan = build_epoch_plan(lens, p, 1)
    assert plan.balanced and plan.micro_batches[0] > 0
    assert len(set(plan.micro_batches.tolist())) == 1
