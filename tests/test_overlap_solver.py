"""nest.solver.overlap.max_drain prices only the start layers with a partial plan; checked
against the full-width DP it replaces (every column priced), to the bit, on random candidates
with infeasible cells, infinite and NaN terms, every stop c (inf included) and many X."""

from __future__ import annotations

import numpy as np
import pytest

from nest.solver.overlap import max_drain, prepare

INF = float("inf")


def full_width(t, ok, e, r, X, c):
    """max_drain as it was: every (a, o) column of every stage priced."""
    J, L = t.shape[0], t.shape[1]
    tril = np.tril(np.ones((L, L), dtype=bool))[:, :, None]
    f = np.full(L, -INF)
    prev = np.zeros(L)
    prev[1:] = -INF
    args = []
    for j in range(J):
        base = ok[j] & (t[j] <= X) & tril & (e[j] - prev[None, :, None] <= c)
        val = np.where(base, prev[None, :, None] + r[j], -INF).reshape(L, -1)
        idx = val.argmax(axis=1)
        f = val[np.arange(L), idx]
        args.append(idx)
        prev = np.concatenate([[-INF], f[:-1]])
    if not f[L - 1] > -INF:
        return -INF, None
    O = t.shape[-1]
    stages, b = [], L - 1
    for j in range(J - 1, -1, -1):
        a, o = divmod(int(args[j][b]), O)
        stages.append((a, b, o))
        b = a - 1
    return float(f[L - 1]), stages[::-1]


@pytest.mark.parametrize("seeds", [range(0, 20), range(20, 40)])
def test_max_drain_is_the_full_width_dp(seeds):
    found = 0
    with np.errstate(invalid="ignore"):
        for seed in seeds:
            found += _compare(seed)
    assert found > 100


def _compare(seed) -> int:
    rng = np.random.default_rng(seed)
    J, L, O = int(rng.integers(1, 6)), int(rng.integers(1, 12)), int(rng.integers(1, 4))
    J = min(J, L)
    shape = (J, L, L, O)
    t = rng.choice([0.5, 1.0, 1.5, 2.0, 3.0], size=shape)  # ties: first maximum kept
    e = rng.choice([0.0, 0.5, 1.0, 2.0, 4.0], size=shape)
    r = rng.choice([0.0, 0.25, 0.5, 1.0], size=shape)
    ok = rng.random(shape) < rng.choice([0.5, 0.9, 1.0])
    if seed % 3 == 1:  # terms the kernel never gives a fitting cell, all the same exact
        r = np.where(rng.random(shape) < 0.1, INF, r)
        e = np.where(rng.random(shape) < 0.1, -INF, e)
    if seed % 3 == 2:
        r = np.where(rng.random(shape) < 0.05, np.nan, r)
        t = np.where(rng.random(shape) < 0.05, np.nan, t)
    prep = prepare(t, ok, r)
    found = 0
    for X in (0.5, 1.0, 2.0, 3.0, INF):
        for c in (-1.0, 0.0, 0.5, 1.0, 2.0, 4.0, INF):
            want = full_width(t, ok, e, r, X, c)
            got = max_drain(t, ok, e, r, X, c, prep)
            assert (got[1] is None) == (want[1] is None), (X, c, got, want)
            if want[1] is not None:
                assert got[1] == want[1] and got[0] == want[0], (X, c, got, want)
                found += 1
            assert max_drain(t, ok, e, r, X, c) == got  # prep computed inside: the same
    return found
