"""The paper's objective with an overlapped gradient sync, optimised exactly:
C max_j t_j + max(0, max_j (e_j - D_j)),  D_j = sum_{k<j} r_k  (nest.costs.pipeline.objective_s).

With training setting dp_overlap: stage | bucketed the evaluator lets stage j's gradient sync
start after its own last backward (in buckets under it, for "bucketed") while the backward of the
last micro-batch still drains through stages j - 1 .. 0 (nest.costs.pipeline.dp_sync_tail_s): e_j is
what stage j adds after its own last backward, r_k = B_k + sb_k its backward busy time per
micro-batch (the stage kernel's `tail` and `drain`, nest.costs.stage.overlap_terms). The credit
D_j couples the stages, so the bottleneck DP of nest.solver (one max per stage) does not apply;
this module solves it exactly for one candidate (variant, p, d, placement):

* feasible(X, c): is there a cut with every stage cell t <= X, ok, and e_j <= c + D_j? A DP over
  stage positions whose value is the largest drain sum D reachable at (stage j, last layer b):
  among partial plans that end at the same layer and meet every constraint so far, the one with
  the largest D dominates (later constraints only get easier with more D; X binds per cell), so
  keeping only it is exact (`max_drain`).
* X(c) = the least X (among the distinct stage times) with feasible(X, c): a bisection.
* Y(X) = the least tail max(0, max_j (e_j - D_j)) over plans with max t <= X: walk c downwards,
  each time just below the tail of the plan the DP returns, until nothing is feasible (every
  plan returned has a strictly smaller tail; finitely many plans); after a few steps, a
  bisection over the float64 values of c finds the least feasible one (`least_tail`).
* T = min over the Pareto frontier of (max t, tail) of C X + Y, walked as nest.solver.solve_fixed
  walks it (epsilon-constraint method, Haimes et al. 1971).
"""

from __future__ import annotations

import math

import numpy as np

from nest.costs.pipeline import overlap_tail
from nest.solver.dp import bottleneck

INF = float("inf")


def prepare(t, ok, r):
    """What every max_drain call of one candidate shares: t where the cell is ok and a <= b,
    NaN elsewhere (NaN <= X is false: the same test as ok & (t <= X) & tril), and whether r
    holds no +inf or NaN (then a start layer a with no partial plan adds -inf to every cell
    of that column, whatever c: `max_drain` leaves those columns out)."""
    L = t.shape[1]
    tril = np.tril(np.ones((L, L), dtype=bool))[None, :, :, None]
    return np.where(ok & tril, t, np.nan), not bool((np.isnan(r) | np.isposinf(r)).any())


def max_drain(t, ok, e, r, X: float, c: float, prep=None):
    """(D, stages): the largest sum of r over all stages but the last, over cuts into J
    contiguous stages whose every cell has t <= X, ok and e_j <= c + D_j (D_j: the sum of r over
    the stages before j); stages = [(first, last, option)] or (-inf, None) if none. prep:
    `prepare(t, ok, r)`, computed here if not given. Only the start layers a from the first to
    the last with a partial plan (prev[a] > -inf) are priced where every other column's cells
    are -inf (prev[a] -inf or NaN: e - prev <= c fails, or with c = inf adds -inf + r = -inf
    for r without +inf or NaN): each row's first maximum, and so its value and argument (moved
    by the columns left of the slice), is the same wherever it is finite, the only rows the
    backtrack reads. Rows are priced from lo (a <= b) to L - J + j (the J - 1 - j stages after
    need a layer each; a row past it feeds only such rows of the next stage, never the last
    stage's row L - 1), the others left -inf (tests/test_overlap_solver.py against the
    full-width DP)."""
    tm, r_safe = prepare(t, ok, r) if prep is None else prep
    J, L, O = t.shape[0], t.shape[1], t.shape[-1]
    f = np.full(L, -INF)
    prev = np.zeros(L)
    prev[1:] = -INF  # stage 0 starts at layer 0 with D_0 = 0
    args = []
    for j in range(J):
        lo, hi = 0, L
        if r_safe or c < INF:
            fin = np.flatnonzero(prev > -INF)
            if len(fin):
                lo, hi = int(fin[0]), int(fin[-1]) + 1
        blo, bhi = lo, L - J + j + 1  # live rows: b >= a >= lo, and J - 1 - j layers left after b
        f = np.full(L, -INF)
        arg = np.zeros(L, dtype=np.int64)
        if blo < bhi:
            pv = prev[None, lo:hi, None]
            # e_j - D_j <= c, in the same arithmetic as `tail_of` (D summed in stage order), so
            # the DP and the tail agree to the last bit; no stage starts where prev is -inf
            base = (tm[j, blo:bhi, lo:hi] <= X) & (e[j, blo:bhi, lo:hi] - pv <= c)
            val = np.where(base, pv + r[j, blo:bhi, lo:hi], -INF).reshape(bhi - blo, -1)
            idx = val.argmax(axis=1)
            f[blo:bhi] = val[np.arange(bhi - blo), idx]
            arg[blo:bhi] = idx + lo * O
        args.append(arg)
        prev = np.concatenate([[-INF], f[:-1]])  # prev[a] = f[a - 1]
    if not f[L - 1] > -INF:
        return -INF, None
    stages, b = [], L - 1
    for j in range(J - 1, -1, -1):
        a, o = divmod(int(args[j][b]), O)
        stages.append((a, b, o))
        b = a - 1
    return float(f[L - 1]), stages[::-1]


def tail_of(e, r, stages) -> float:
    """max(0, max_j (e_j - D_j)) of a plan (nest.costs.pipeline.overlap_tail on its cells)."""
    return overlap_tail([e[j, b, a, o] for j, (a, b, o) in enumerate(stages)],
                        [r[j, b, a, o] for j, (a, b, o) in enumerate(stages)])


def least_x(t, ok, e, r, times: np.ndarray, lo: int, cap: float, prep=None):
    """The least X in `times` (sorted, from index lo) with a plan of tail <= cap, or None."""
    hi = len(times) - 1
    if hi < lo or max_drain(t, ok, e, r, float(times[hi]), cap, prep)[1] is None:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if max_drain(t, ok, e, r, float(times[mid]), cap, prep)[1] is None:
            lo = mid + 1
        else:
            hi = mid
    return float(times[lo])


def _bits(x: float) -> int:
    return int(np.float64(x).view(np.int64))  # monotone in x for x >= 0


def _float(bits: int) -> float:
    return float(np.int64(bits).view(np.float64))


def least_tail(t, ok, e, r, X: float, cap: float, walk: int = 8, prep=None):
    """(Y, stages): the least tail over plans with max t <= X and tail <= cap. Walks c down from
    cap, each time just below the tail of the plan the DP returns (every plan returned has a
    strictly smaller tail); after `walk` steps it bisects the float64 bit patterns of c in
    [0, c) for the least feasible c (<= 64 more DP calls), then walks on from that plan."""
    best, best_stages, c = INF, None, cap
    steps = 0
    while True:
        _, stages = max_drain(t, ok, e, r, X, c, prep)
        if stages is None:
            return best, best_stages
        y = tail_of(e, r, stages)
        if y < best:
            best, best_stages = y, stages
        if best <= 0.0:
            return best, best_stages
        c = float(np.nextafter(min(best, c), -np.inf))  # strictly down: finitely many steps
        steps += 1
        if steps % walk == 0:  # bisect: infeasible at lo (lo = -1: below 0), feasible at hi
            if max_drain(t, ok, e, r, X, c, prep)[1] is None:
                return best, best_stages
            lo, hi = -1, _bits(c)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if max_drain(t, ok, e, r, X, _float(mid), prep)[1] is None:
                    lo = mid
                else:
                    hi = mid
            c = _float(hi)


def solve_fixed_overlap(t, ok, e, r, C: float, best_T: float = INF):
    """Exact min of C max t + max(0, max_j (e_j - D_j)) for one candidate; (T, stages) or None
    if nothing fits below best_T. Arrays [J, L(b), L(a), O] as nest.solver.arrays builds them."""
    valid = ok & np.tril(np.ones(t.shape[1:3], dtype=bool))[None, :, :, None]
    times = np.unique(t[valid])
    if not len(times):
        return None
    X0, _ = bottleneck(t, np.zeros_like(t), ok, INF)  # the least max t at all: a floor
    if not math.isfinite(X0):
        return None
    lo = int(np.searchsorted(times, X0))
    cap, best = INF, None
    prep = prepare(t, ok, r)  # shared by every max_drain call below
    while True:
        X = least_x(t, ok, e, r, times, lo, cap, prep)
        if X is None or C * X >= best_T:
            break
        Y, stages = least_tail(t, ok, e, r, X, cap, prep=prep)
        assert Y <= cap, "the DP and the tail disagree"  # each cap strictly lower: terminates
        if C * X + Y < best_T:
            best_T, best = C * X + Y, stages
        if Y <= 0.0:
            break
        cap = float(np.nextafter(Y, -np.inf))
        lo = int(np.searchsorted(times, X))
    return None if best is None else (best_T, best)
