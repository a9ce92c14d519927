"""Alpa-E: Alpa's inter- and intra-operator search (Zheng et al. 2022, "Alpa: Automating Inter- and
Intra-Operator Parallelism for Distributed Deep Learning", OSDI, sections 4 and 5) with our cost
model in place of Alpa's profiler (the NEST paper, section 5.1, calls this variant Alpa-E).

Inter-operator pass (Alpa section 5.2). The cluster is Alpa's 2-D mesh: nodes x devices per node,
with an intra-node and an inter-node bandwidth (baselines.alpa_e_ilp.mesh_view). Stages take
submeshes of Alpa's shapes, (1, 2^k) inside a node or (n, M) whole nodes, and the submeshes must
cover every device: one pipeline, no idle device, extra devices go to the stages' intra-operator
sharding. For B micro-batches (Alpa Eq. 2)
    T* = min over stage slicings and submesh assignments of  sum_i t_i + (B - 1) * max_j t_j,
solved as Alpa does (Eq. 3-4) by enumerating t_max over the stage latencies in increasing order,
    F(s, k, d; t_max) = min_{i >= k, submesh n} t_intra(k..i, n, s) + F(s-1, i+1, d - |n|)
                        over t_intra <= t_max,        F(0, L, 0; t_max) = 0,
    T*(t_max) = min_s F(s, 0, N; t_max) + (B - 1) * t_max,
from the least feasible t_max up, with Alpa's early stop (B * t_max >= the best T*). Each
t_max's value F comes from baselines.alpa_e_dp.CapDP (the loop `_dp`, vectorised: the same
floats; CapDP runs the loop itself on tables it does not vectorise); CapDP.stages backtracks
the stages at the best t_max.
t_intra(k..i, n, s) comes from the intra-operator pass (Alpa section 4, baselines.alpa_e_ilp): an
ILP picks each layer's sharding on the submesh minimising communication + resharding, then the
latency of that sharding is estimated (compute + communication), then memory is checked (Alpa
Eq. 5: the stage holds s stashed micro-batches, s = the stages from it to the end, capped at B) for
each of Alpa's autosharding configs (`zero_stages` x `recompute_modes`: weight-update sharding,
ZeRO-3, remat) and the fastest config that fits is kept; none fits: infinity ("post hoc": the
sharding was chosen without looking at memory).

Mapping into the plan contract (nest.problem.plan: one sub-graph variant per stage, per-stage device
counts). Alpa's data parallelism maps onto it exactly: a pipeline micro-batch is D slices of mbs
sequences, a stage running variant v_j on D * tp_j * cp_j devices is data-parallel over
d_j = D / ep_j replicas (ep_j divides D by construction), and the plan's dp * ep = D micro-batch
streams are the same for every stage (plan.dp = D / ep_0, stage_dp(j) = D / ep_j, m = B).
  1. Alpa's optimum (per-stage submeshes, per-layer shardings), whenever every stage's layers use
     one sharding option: stage j gets its own variant and its own submesh (per-stage tp, sp, ep,
     cp where they differ from stage 0's). Where the ILP's sharding of a stage mixes options but a
     single option reaches the same ILP objective (a tie, e.g. expert-parallel degree on layers
     without experts), that option is taken and the stage's latency and Alpa's objective are
     re-estimated for it (the notes count such stages);
  2. else (a stage mixes shardings across its layers: per-layer resharding inside a stage is not
     expressible in the contract) the same search with the ILP restricted to one variant per
     stage (per-stage variants and submeshes as in 1);
  3. only when those plans fail the evaluator's memory check or the search is capped: the best
     single-variant plan of the same algorithm: for every variant v and split D, the DP
     restricted to v (stages of D * tp * cp devices, p = N / (D * tp * cp), dp = D / ep), ranked
     by Alpa's objective.
The notes say which case happened and describe Alpa's optimum. Submeshes are placed as Alpa
covers the mesh (section 5.2): stage j on a contiguous block of devices, replicas of width
tp_j * ep_j * cp_j consecutive (tp fastest), the blocks in stage order when no submesh then
straddles a node, else whole-node submeshes on whole nodes and the (1, 2^k) ones packed into the
remaining nodes, largest first. Homogeneous plans are the contract's `replica_major` layout,
heterogeneous ones `custom`. The chosen plan is checked with the shared evaluator; if it is out
of memory the next one in Alpa's order is taken (pick the fastest, check memory, fall back).

Deliberate deviations from Alpa:
* Layer granularity: the ILP's nodes are layers and its options the model's sub-graph variants
  (Alpa shards every operator with its own strategies). The per-replica micro-batch is the
  problem's mbs, so a pipeline micro-batch is D slices of mbs sequences and every layer of a
  stage is data-parallel over D / ep replicas (Alpa's ILP could mix batch-sharding degrees).
* B (Alpa's num_micro_batches, a user input) is tuned: every D dividing N is tried, B =
  ceil(global_batch / (mbs * D)), as Alpa's users (and its benchmark suite) tune it; the setting
  `num_microbatches` fixes it, and then extra devices can only go to sharding or more stages.
* The ILP's costs are communication only, as in Alpa, with compute at weight `compute_tiebreak`
  to break exact ties deterministically. Gradient synchronisation and ZeRO collectives are
  bucketed per stage (as XLA's all-reduce combiner and our evaluator do); the ILP sees each
  layer's share at the bucket's cost per byte (Alpa prices communication as bytes / bandwidth).
  Synchronisation and the optimizer step run once per batch (gradient accumulation): t_intra
  carries them amortised over B, so Alpa's Eq. 2 charges the bottleneck stage's about once.
* The ILP of every stage range is solved exactly by dynamic programming along the chain of
  layers (the ILP of a chain has an integral LP, and the DP is its optimum); HiGHS re-solves the
  ILP of every stage of Alpa's optimum and the notes say if any disagree. Tests check both against
  brute force.
* Alpa's DP ignores cross-mesh (pipeline) communication; so do we (the evaluator charges it). It
  also ignores Megatron's tied-embedding all-reduce.
* Alpa's objective (Eq. 2, nest.costs.pipeline.alpa_objective) is part of what Alpa is: it is
  optimised whatever the training settings' pipeline_time and dp_overlap say (the evaluator
  scores the plan under them).
* One logical mesh per submesh (tp innermost, as the contract orders ranks); Alpa also tries
  other logical shapes, which are never cheaper for our variants. Alpa's configs have no
  selective recomputation and no ZeRO-2 (they can be added through the settings).
* Operator clustering (Alpa section 5.2) is not needed: the layer graph is already layers.
* The search has a budget counted in DP passes (`max_dp_passes`: one pass of Alpa's DP for one
  t_max candidate and one D), never in wall-clock time, so the same inputs give the same plan on
  any machine; a run that spends it says so (plan.extra["budget_exhausted"] and its notes; the
  single-variant search always completes, so it still returns a plan).
* Alpa's ILP may reshard between layers inside a stage; the contract holds one variant per stage,
  so such an optimum is replaced by the search with one variant per stage (case 2 above).
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np

from dataclasses import dataclass, replace

from baselines.alpa_e_dp import CapDP
from baselines.alpa_e_ilp import (mesh_view, range_tables, sharding_of, sharding_table,
                                  solve_ilp, stage_cost, submesh_sizes)
from nest.costs.memory import peak
from nest.costs.pipeline import alpa_objective, dapple, held_bytes, stash
from nest.problem.evaluate import Problem, evaluate
from nest.problem.plan import Plan
from nest.planners.registry import NoPlan, merged_settings
from nest.problem.space import make_plan

DEFAULTS = {
    # budget of the whole search, in DP passes (deterministic); a safety stop, not a tuning: the
    # heaviest Figure 5/7 point (Llama-3-70B, 1024 fat-tree devices) uses 167 and no point of the
    # default run spends it (budget_exhausted in results/expected/default/)
    "max_dp_passes": 20000,
    "zero_stages": [0, 1, 3],  # Alpa: default, weight-update sharding, ZeRO-3 (force_zero_stage_3)
    "recompute_modes": ["none", "full"],  # Alpa's remat is whole-layer
    "num_microbatches": None,  # Alpa's B; None: tuned over every D dividing N
    "compute_tiebreak": 1e-3,
    "tmax_rel_gap": 0.0,  # Alpa's epsilon: skip t_max within this relative gap (0: exact)
}


class Capped(Exception):
    pass


class Budget:
    """DP passes left; spending past zero raises Capped."""

    def __init__(self, passes: int):
        self.left = int(passes)

    def spend(self) -> None:
        if self.left <= 0:
            raise Capped
        self.left -= 1


# --------------------------------------------------------------------------------------------
# The inter-operator DP
# --------------------------------------------------------------------------------------------


def stage_times(rt, problem: Problem, B: int, smax: int):
    """t_intra[k, i, s-1] and the knob config kept, for s = 1..smax stages from this one on:
    the fastest config whose memory with min(s, B) stashed micro-batches fits (evaluator formula:
    alloc * (1 + fragmentation) + framework overhead <= HBM); the first config on ties.

    A config's memory grows with the stash (fixed + n act, then max with the step's bytes, then
    the peak's affine map: IEEE operations monotone in n for act >= 0), so whether it fits is a
    prefix of the stash counts: each (config, range) finds its last fitting count by bisection
    over the distinct counts (each probe the same elementwise arithmetic at that count), and
    t[., s] is the least latency among the configs fitting at s. `_stage_times_every`, the
    arithmetic at every s, is taken where a latency is NaN or an activation negative (never
    in the tables; tests/test_baseline_alpa_e.py checks both bit for bit)."""
    O, L, _ = rt.time_OKI.shape
    kk, ii = np.triu_indices(L)  # ranges k <= i only (elsewhere t inf, the first knob kept)
    time_OR, act_OR = rt.time_OKI[:, kk, ii], rt.act_OKI[:, kk, ii]
    if np.isnan(time_OR).any() or (act_OR < 0).any():
        return _stage_times_every(rt, problem, B, smax)
    hw = problem.cluster.hardware
    fixed_OR = rt.fixed_OKI[:, kk, ii]
    step_OR = 0.0 if rt.step_OKI is None else rt.step_OKI[:, kk, ii]
    # a stage with s stages from it to the end sits at position p - s of p (nest.costs.pipeline)
    n_S = np.array([stash(s, 0, B) for s in range(1, smax + 1)], dtype=float)
    counts = np.unique(n_S)  # increasing
    lo = np.zeros(fixed_OR.shape, dtype=np.intp)  # counts[:lo] fit, counts[hi:] do not
    hi = np.full(fixed_OR.shape, counts.size, dtype=np.intp)
    with np.errstate(invalid="ignore"):
        while (active := lo < hi).any():
            mid = (lo + hi) // 2
            n = counts[np.minimum(mid, counts.size - 1)]
            fits = peak(held_bytes(fixed_OR, n, act_OR, step_OR), hw) <= hw.hbm_bytes
            lo = np.where(active & fits, mid + 1, lo)
            hi = np.where(active & ~fits, mid, hi)
    at_S = np.searchsorted(counts, n_S)  # each s's count's position
    t_RS = np.full((kk.size, smax), np.inf)
    o_RS = np.zeros((kk.size, smax), dtype=np.intp)
    for o in range(O):  # strictly less: the first config on ties, as argmin
        cand = np.where(at_S[None, :] < lo[o][:, None], time_OR[o][:, None], np.inf)
        better = cand < t_RS
        t_RS = np.where(better, cand, t_RS)
        o_RS[better] = o
    t_KIS = np.full((L, L, smax), np.inf)
    o_KIS = np.zeros((L, L, smax), dtype=np.intp)
    t_KIS[kk, ii], o_KIS[kk, ii] = t_RS, o_RS
    return t_KIS, o_KIS


def _stage_times_every(rt, problem: Problem, B: int, smax: int):
    """`stage_times` by the arithmetic at every stage count s (its reference)."""
    hw = problem.cluster.hardware
    num_stashed = np.array([stash(s, 0, B) for s in range(1, smax + 1)], dtype=float)
    O, L, _ = rt.time_OKI.shape
    kk, ii = np.triu_indices(L)

    def ranges(x_OKI):
        return x_OKI[:, kk, ii][..., None]  # [o, range, 1]

    step = 0.0 if rt.step_OKI is None else ranges(rt.step_OKI)  # the optimizer's copy
    alloc = held_bytes(ranges(rt.fixed_OKI), num_stashed, ranges(rt.act_OKI), step)
    with np.errstate(invalid="ignore"):
        fits = peak(alloc, hw) <= hw.hbm_bytes
    t = np.where(fits, ranges(rt.time_OKI), np.inf)
    t_KIS = np.full((L, L, smax), np.inf)
    o_KIS = np.zeros((L, L, smax), dtype=np.intp)
    t_KIS[kk, ii], o_KIS[kk, ii] = t.min(axis=0), t.argmin(axis=0)
    return t_KIS, o_KIS


def _dp(T_XKIS, units, U, cap, combine, backtrack=False):
    """F(s, k, d) of the module docstring with `combine` = np.add (sum of latencies) or
    np.maximum (the bottleneck); stage options above `cap` are excluded. Returns (value, s) of
    min_s F(s, 0, U), and the stages [(k, i, x, s)] if backtrack. The reference of
    baselines.alpa_e_dp.CapDP, which gives the value of a pass faster and falls back to this loop
    on tables it does not vectorise (entries with i < k, no stage count)."""
    X, L, _, Smax = T_XKIS.shape
    umin, umax = min(units), max(units)
    F_prev = np.full((L + 1, U + 1), np.inf)
    F_prev[L, 0] = 0.0
    best, best_s, arg = np.inf, 0, []
    for s in range(1, min(Smax, L) + 1):
        F = np.full((L + 1, U + 1), np.inf)
        a_i = np.zeros((L + 1, U + 1), dtype=np.int32)
        a_x = np.zeros((L + 1, U + 1), dtype=np.int32)
        kmax = L - s  # the s - 1 later stages need a layer each
        dlo, dhi = s * umin, min(U, s * umax)
        if dlo > U:
            break
        d = np.arange(dlo, dhi + 1)
        for xi, u in enumerate(units):
            A = T_XKIS[xi, : kmax + 1, : kmax + 1, s - 1]
            A = np.where(A <= cap, A, np.inf)
            src = d - u
            ok = src >= 0
            G = np.full((kmax + 2, len(d)), np.inf)  # row kmax + 1: padding, all inf
            G[: kmax + 1, ok] = F_prev[1: kmax + 2][:, src[ok]]  # row i: F(s-1, i+1, d - u)
            # only the band i - k in [lo, hi] of A's finite entries counts (A is inf for i < k
            # and, under the cap, past the longest range that fits): the same sums, the same
            # least i reaching the minimum; a row without a finite entry changes nothing
            kk, ii = np.nonzero(np.isfinite(A))
            if not kk.size:
                continue
            lo, hi = int((ii - kk).min()), int((ii - kk).max())
            i_KJ = np.arange(kmax + 1)[:, None] + np.arange(lo, hi + 1)[None, :]
            inside = (i_KJ >= 0) & (i_KJ <= kmax)
            i_KJ = np.where(inside, i_KJ, kmax + 1)
            rows = np.arange(kmax + 1)[:, None]  # gathers by index (take_along_axis's values)
            A_KJ = np.where(inside, A[rows, np.clip(i_KJ, 0, kmax)], np.inf)
            cand = combine(A_KJ[:, None, :], G[i_KJ].transpose(0, 2, 1))  # [k, d, j]
            if backtrack:
                j_best = cand.argmin(axis=-1)
                v = cand[rows, np.arange(len(d))[None, :], j_best]
                i_best = i_KJ[rows, j_best]
            else:
                v = cand.min(axis=-1)
            better = v < F[: kmax + 1, dlo: dhi + 1]
            F[: kmax + 1, dlo: dhi + 1] = np.where(better, v, F[: kmax + 1, dlo: dhi + 1])
            if backtrack:
                a_i[: kmax + 1, dlo: dhi + 1] = np.where(better, i_best,
                                                         a_i[: kmax + 1, dlo: dhi + 1])
                a_x[: kmax + 1, dlo: dhi + 1] = np.where(better, xi, a_x[: kmax + 1, dlo: dhi + 1])
        if backtrack:
            arg.append((a_i, a_x))
        if F[0, U] < best:
            best, best_s = F[0, U], s
        F_prev = F
    if not backtrack or not math.isfinite(best):
        return best, best_s, None
    stages, k, d = [], 0, U
    for s in range(best_s, 0, -1):
        a_i, a_x = arg[s - 1]
        i, xi = int(a_i[k, d]), int(a_x[k, d])
        stages.append((k, i, xi, s))
        k, d = i + 1, d - units[xi]
    assert k == L and d == 0
    return best, best_s, stages


def inter_op_dp(T_XKIS, units, U, B, rel_gap=0.0, budget: Budget | None = None,
                bound=np.inf):
    """Alpa's DP (Eq. 2-4): (T*, t_max, stages [(k, i, x, s)]) or None when nothing fits (or
    nothing can beat `bound`)."""
    dp = CapDP(T_XKIS, units, U)  # _dp's value, vectorised (baselines.alpa_e_dp)
    lb = dp.least_cap()  # the least feasible t_max: _dp(..., np.inf, np.maximum)'s value
    if not math.isfinite(lb) or B * lb >= bound:
        return None
    vals = dp.caps[dp.caps >= lb]  # np.unique(T_XKIS[np.isfinite(T_XKIS) & (T_XKIS >= lb)])
    # the least sum of stage latencies under no cap: F(s, 0, U; t_max) never falls below it, so
    # every t_max >= c gives T >= F_inf + (B - 1) c; priced on first use (where Alpa's own stop
    # does not decide first: with many micro-batches, never), and where its cheap lower bound
    # (CapDP.sum_floor) does not already decide the stop
    F_inf = _Floor(lambda: dp.value(np.inf), dp.sum_floor)
    if rel_gap:
        best, best_c = _scan_every(dp.value, B, vals, F_inf, rel_gap, budget)
    else:
        best, best_c = _scan_pruned(dp.value, B, vals, F_inf, budget)
    F, _, stages = dp.stages(best_c)  # _dp(..., np.add, backtrack=True)
    t_max = max(T_XKIS[x, k, i, s - 1] for k, i, x, s in stages)
    return float(dapple(F, t_max, B)), float(t_max), stages


class _Once:
    """A value computed on its first call, then kept."""

    def __init__(self, fn):
        self.fn, self.v = fn, None

    def __call__(self) -> float:
        if self.v is None:
            self.v = self.fn()
        return self.v


class _Floor(_Once):
    """F_inf (a `_Once`) with a cheap lower bound `lower` of it: `reaches` decides
    `F_inf + extra >= best` from the bound where the bound reaches best (then F_inf, at least
    the bound, does too: IEEE addition is monotone), and prices F_inf only where it does not."""

    def __init__(self, fn, lower):
        super().__init__(fn)
        self.lower = lower


def _reaches(F, extra: float, best: float) -> bool:
    """F + extra >= best, F a float, a `_Once` or a `_Floor` (whose bound is tried first: the
    same answer, F_inf priced only where the bound falls short)."""
    if isinstance(F, _Floor) and F.v is None and F.lower() + extra >= best:
        return True
    return (F() if callable(F) else F) + extra >= best


def _stops(c, B: int, best: float, F_inf) -> bool:
    """Alpa's early pruning (every later plan has T >= B * t_max), then ours: F(t_max) >= F_inf,
    so every t_max >= c has T >= F_inf + (B - 1) c. Both grow with c for a fixed best. F_inf: a
    float, a `_Once` or a `_Floor`, called only when the first test fails and best is finite
    (F_inf is finite wherever some t_max is feasible, so the second test is false for an
    infinite best)."""
    if B * c >= best:
        return True
    if not math.isfinite(best):
        return False
    return _reaches(F_inf, (B - 1) * c, best)


def _scan_every(F_of, B, vals, F_inf, rel_gap, budget):
    """Alpa's walk over t_max in increasing order, one DP pass per t_max (F_of(t_max): the DP's
    least sum under that cap), skipping t_max within `rel_gap` of the last one priced: (best T*,
    its t_max)."""
    best, best_c, last = np.inf, None, -np.inf
    for c in vals:
        if _stops(c, B, best, F_inf):
            break
        if c < last * (1 + rel_gap):
            continue
        if budget is not None:
            budget.spend()
        last = c
        F = F_of(c)
        if dapple(F, c, B) < best:  # Alpa's Eq. 2 (nest.costs.pipeline.alpa_objective)
            best, best_c = dapple(F, c, B), c
    return best, best_c


def _scan_pruned(F_of, B, vals, F_inf, budget, walk: int = 8):
    """The same walk as `_scan_every` with no gap (the same best, the same t_max, the same stop),
    pricing fewer t_max: F(t_max), the DP's least sum under the cap t_max, never grows with
    t_max (a larger cap only adds options; each plan's sum is the same floats under any cap), so
    on a run of t_max values [lo, hi] every T = F(t) + (B - 1) t >= F(hi) + (B - 1) lo. A run
    whose bound reaches the best so far updates nothing and is skipped (the walk's stop inside it
    read at its last value, the stop growing with t_max); else it is split at its middle, whose
    F bounds the left half. The walk's own updates happen in its order: a t_max is compared with
    the best of the smaller ones only, as Alpa's walk does. The first `walk` t_max are walked
    one by one (where Alpa's stop comes early, as with many micro-batches, splitting would price
    more of them than the walk)."""
    head = min(walk, len(vals))
    best, best_c = _scan_every(F_of, B, vals[:head], F_inf, 0.0, budget)
    if head == len(vals) or _stops(vals[head], B, best, F_inf):
        return best, best_c
    memo: dict[int, float] = {}
    state = {"best": best, "best_c": best_c}

    def F_at(i: int) -> float:
        if i not in memo:
            if budget is not None:
                budget.spend()
            memo[i] = F_of(vals[i])
        return memo[i]

    def run(lo: int, hi: int, F_low) -> bool:  # False: the walk stopped in [lo, hi]
        best = state["best"]
        if _stops(vals[lo], B, best, F_inf):
            return False
        if _reaches(F_low, (B - 1) * vals[lo], best):
            return not _stops(vals[hi], B, best, F_inf)
        if lo == hi:
            T = dapple(F_at(lo), vals[lo], B)
            if T < best:
                state["best"], state["best_c"] = T, vals[lo]
            return True
        mid = (lo + hi) // 2
        return run(lo, mid, F_at(mid)) and run(mid + 1, hi, F_low)

    run(head, len(vals) - 1, F_inf)
    return state["best"], state["best_c"]


def brute_force_inter_op(T_XKIS, units, U, B):
    """Every slicing and submesh sequence (for tests): min of sum t + (B - 1) max t."""
    X, L, _, Smax = T_XKIS.shape
    best = np.inf
    for p in range(1, min(L, Smax) + 1):
        for inner in itertools.combinations(range(1, L), p - 1):
            b = (0, *inner, L)
            for xs in itertools.product(range(X), repeat=p):
                if sum(units[x] for x in xs) != U:
                    continue
                t = [T_XKIS[x, b[j], b[j + 1] - 1, p - j - 1] for j, x in enumerate(xs)]
                if all(map(math.isfinite, t)):
                    best = min(best, alpa_objective(t, B))
    return best


# --------------------------------------------------------------------------------------------
# The planner
# --------------------------------------------------------------------------------------------


def _knobs(settings):
    return tuple(itertools.product(settings["zero_stages"], settings["recompute_modes"]))


def _splits(problem: Problem, settings) -> list[int]:
    """Candidate pipeline micro-batch splits D (B = ceil(global_batch / (mbs * D)))."""
    N, G, mbs = problem.num_devices, problem.training.global_batch, problem.mbs
    if settings["num_microbatches"]:
        B = int(settings["num_microbatches"])
        if G % (mbs * B) or N % (G // (mbs * B)):
            raise NoPlan(f"num_microbatches={B} must split global_batch={G} into whole "
                         f"mbs={mbs} slices over a divisor of {N} devices")
        return [G // (mbs * B)]
    # D streams of mbs samples must split the global batch exactly (nest.problem.space.splits_batch)
    return [D for D in range(1, N + 1) if N % D == 0 and G % (mbs * D) == 0]


@dataclass
class Uniform:
    """A Result held by the contract: one variant per stage, Alpa's objective for it."""

    variants: list  # per stage
    T: float  # Alpa's objective (the Result's, re-estimated where a tie changed a stage)
    ties: int  # stages whose mixed ILP sharding was replaced by an equally good single option


@dataclass
class Result:
    """Alpa's optimum for one D and one set of sharding options."""

    T: float  # Alpa's objective: sum t + (B - 1) max t
    D: int
    B: int
    xs: list[int]  # submesh widths (devices / D) of the options
    groups: list  # per x: (variants, ShardingTable, RangeTables, knob index array [k, i, s])
    stages: list  # (k, i, x index, s)

    def knob(self, j: int, knobs) -> tuple[int, str]:
        k, i, xi, s = self.stages[j]
        return knobs[self.groups[xi][3][k, i, s - 1]]

    def stage_time(self, j: int) -> float:
        """t_intra of stage j: the estimated latency of the ILP's sharding (Alpa's Eq. 2 term)."""
        k, i, xi, s = self.stages[j]
        _, _, rt, o_KIS = self.groups[xi]
        return float(rt.time_OKI[o_KIS[k, i, s - 1], k, i])

    def uniform(self, tiebreak: float) -> "Uniform | None":
        """Each stage's one variant, if every stage's layers use one sharding option at the ILP's
        optimum (the contract's per-stage variant); None when some stage mixes options (per-layer
        resharding inside a stage, which the contract cannot hold). A stage whose ILP sharding
        mixes options while a single option reaches the same objective (a tie) takes that option,
        with its latency re-estimated (`stage_cost`, the reference of the range tables)."""
        vs_out, ts, ties = [], [], 0
        for j, (k, i, xi, s) in enumerate(self.stages):
            vs, tab, rt, o_KIS = self.groups[xi]
            o = int(o_KIS[k, i, s - 1])
            used = set(sharding_of(rt, o, k, i))
            if len(used) == 1:
                vs_out.append(vs[used.pop()])
                ts.append(self.stage_time(j))
                continue
            mask = int(rt.uniform_OKI[o, k, i])
            if not mask:
                return None
            b = next(b for b in range(len(vs)) if mask >> b & 1)
            vs_out.append(vs[b])
            ts.append(stage_cost(tab, o, k, i, [b] * (i - k + 1), tiebreak)[1])
            ties += 1
        T = alpa_objective(ts, self.B) if ties else self.T
        return Uniform(vs_out, T, ties)

    def describe(self, variants=None) -> str:
        """Runs of stages with the same submesh and shardings: '3 x [32 dev: tp4_sp0_ep1_cp1]'
        (a stage mixing options lists them joined by '+'); `variants`: each stage's variant in
        place of the ILP's sharding."""
        runs: list[list] = []
        for j, (k, i, xi, s) in enumerate(self.stages):
            vs, _, rt, o_KIS = self.groups[xi]
            if variants is not None:
                keys = [variants[j].key]
            else:
                o = int(o_KIS[k, i, s - 1])
                keys = [vs[a].key for a in dict.fromkeys(sharding_of(rt, o, k, i))]
            key = f"{self.D * self.xs[xi]} dev: {'+'.join(keys)}"
            if runs and runs[-1][1] == key:
                runs[-1][0] += 1
            else:
                runs.append([1, key])
        return ", ".join(f"{n} x [{key}]" for n, key in runs)


def split_tables(problem: Problem, cfg, mesh, D: int, options: dict, per_stage: bool,
                 kept: dict | None = None):
    """t_intra of every stage range, submesh and stage count for one D: (T_XKIS, units, U, B,
    groups) with submesh sizes D * g * units (g the gcd of the widths x), U = N / (D * g); None
    when no pipeline of at most one stage per layer covers every device. kept: sharding tables
    already made, by (D, x, options, knobs, B), and where to keep the new ones (Alpa's second
    pass, one variant per stage, reads the first pass's)."""
    N, L = problem.num_devices, problem.graph.num_layers
    B = math.ceil(problem.training.global_batch / (problem.mbs * D))
    xs = sorted(options)
    g = math.gcd(*xs)
    if N % (D * g):
        return None
    units, U = [x // g for x in xs], N // (D * g)
    if U > L * max(units):
        return None  # not enough layers for stages covering every device
    smax = min(L, U // min(units))
    knobs = _knobs(cfg)
    T, groups = [], []
    for x in xs:
        key = (D, x, tuple(options[x]), knobs, B)
        tab = None if kept is None else kept.get(key)
        if tab is None:
            tab = _frozen(sharding_table(problem, mesh, D, x, options[x], knobs, B))
            if kept is not None:
                kept[key] = tab
        rt = range_tables(tab, cfg["compute_tiebreak"], per_stage)
        t_KIS, o_KIS = stage_times(rt, problem, B, smax)
        T.append(t_KIS)
        groups.append((options[x], tab, rt, o_KIS))
    return np.stack(T), units, U, B, groups


def _frozen(tab):
    """The table with its arrays read-only (a cache entry: nest.costs.cache.read_only)."""
    for v in vars(tab).values():
        if isinstance(v, np.ndarray):
            v.setflags(write=False)
    return tab


def solve_split(problem: Problem, cfg, mesh, D: int, options: dict, per_stage: bool,
                budget: Budget | None = None, bound=np.inf, kept: dict | None = None
                ) -> Result | None:
    """Alpa's DP for one D; options maps x -> the variants a layer may take on D * x devices."""
    tables = split_tables(problem, cfg, mesh, D, options, per_stage, kept)
    if tables is None:
        return None
    T, units, U, B, groups = tables
    res = inter_op_dp(T, units, U, B, cfg["tmax_rel_gap"], budget, bound)
    if res is None:
        return None
    return Result(res[0], D, B, sorted(options), groups, res[2])


def _options(problem: Problem, mesh, D: int, variants) -> dict:
    sizes = set(submesh_sizes(problem.num_devices, mesh.levels[0].devices_per_group))
    out: dict[int, list] = {}
    for v in variants:
        x = v.tp * v.cp
        if D % v.ep == 0 and D * x in sizes:
            out.setdefault(x, []).append(v)
    return out


def alpa(problem: Problem, cfg, mesh, per_stage: bool, budget: Budget,
         kept: dict | None = None) -> Result | None:
    """Alpa's search over every D: per-stage submeshes, per-layer (or per-stage) variants."""
    best = None
    for D in _splits(problem, cfg):
        budget.spend()  # each D costs at least one pass
        opts = _options(problem, mesh, D, problem.graph.variants)
        if not opts:
            continue
        r = solve_split(problem, cfg, mesh, D, opts, per_stage, budget,
                        best.T if best else np.inf, kept)
        if r is not None and (best is None or r.T < best.T):
            best = r
    return best


def single_variant(problem: Problem, cfg, mesh) -> tuple[list[Result], int]:
    """The same DP restricted to one variant (one stage size) at a time: every (D, v) result,
    and how many (D, v) can cover the devices with at most one stage per layer."""
    out, shapes = [], 0
    N, L = problem.num_devices, problem.graph.num_layers
    for D in _splits(problem, cfg):
        for v in problem.graph.variants:
            opts = _options(problem, mesh, D, [v])
            if not opts or N % (D * v.tp * v.cp) or N // (D * v.tp * v.cp) > L:
                continue
            shapes += 1
            r = solve_split(problem, cfg, mesh, D, opts, False)
            if r is not None:
                out.append(r)
    return out, shapes


def verify_with_highs(r: Result, tiebreak: float) -> tuple[int, int]:
    """Re-solve the ILP of every chosen stage that has a choice with HiGHS: (solved, disagreeing
    with the chain DP). They agree unless HiGHS's tolerances bite."""
    n = bad = 0
    for k, i, xi, s in r.stages:
        vs, tab, rt, o_KIS = r.groups[xi]
        if len(vs) < 2:
            continue
        o = int(o_KIS[k, i, s - 1])
        node = tab.comm_LVO[k:i + 1, :, o] + tiebreak * tab.comp_LVO[k:i + 1, :, o]
        val, _ = solve_ilp(node, tab.resh_LVV[k:i])
        n += 1
        bad += not math.isclose(val, rt.obj_OKI[o, k, i], rel_tol=1e-6, abs_tol=1e-12)
    return n, bad


def submesh_offsets(sizes: list[int], per_node: int) -> tuple[list[int], bool]:
    """First device of each stage's contiguous submesh (module docstring): in stage order when no
    submesh then straddles a node, else Alpa's covering (whole-node submeshes on whole nodes, the
    smaller ones packed into the remaining nodes, largest first). Returns (offsets, whether every
    submesh sits inside one node or on whole nodes, as Alpa's shapes do); False only when the
    sizes cannot be packed so (a node size that is not a power of two), the offsets then in stage
    order."""
    M = per_node
    order = list(itertools.accumulate([0, *sizes[:-1]]))
    if all(o // M == (o + n - 1) // M or (o % M == 0 and n % M == 0)
           for o, n in zip(order, sizes)):
        return order, True
    out, nxt = [0] * len(sizes), 0
    for j, n in enumerate(sizes):
        if n % M == 0:  # (n, M): whole nodes
            out[j], nxt = nxt, nxt + n
    nodes: list[list[int]] = []  # [first device, devices taken] of the shared nodes
    for j in sorted((j for j, n in enumerate(sizes) if n % M), key=lambda j: (-sizes[j], j)):
        node = next((nd for nd in nodes if nd[1] + sizes[j] <= M), None)
        if node is None:
            node = [nxt, 0]
            nodes.append(node)
            nxt += M
        out[j] = node[0] + node[1]
        node[1] += sizes[j]
    if nxt != sum(sizes):
        return order, False
    return out, True


def contract_gap(problem: Problem, r: Result, u: Uniform) -> str:
    """Why the contract cannot hold Alpa's data parallelism for this result ('' when it can):
    every stage must run the same D = dp * ep micro-batch streams, stage j data-parallel over
    D / ep_j replicas on its submesh of D * tp_j * cp_j devices, all devices used."""
    sizes = [r.D * v.tp * v.cp for v in u.variants]
    for j, ((_, _, xi, _), v) in enumerate(zip(r.stages, u.variants)):
        if r.D % v.ep:
            return f"stage {j}: ep={v.ep} does not divide D={r.D}"
        if sizes[j] != r.D * r.xs[xi]:
            return f"stage {j}: {sizes[j]} devices for a submesh of {r.D * r.xs[xi]}"
    if sum(sizes) != problem.num_devices:
        return f"the submeshes hold {sum(sizes)} of {problem.num_devices} devices"
    return ""


def to_plan(problem: Problem, r: Result, u: Uniform, knobs) -> tuple[Plan, str]:
    """The plan of a result with one variant per stage, and a note ('' if none). Plan-level
    variant = stage 0's, dp = D / ep_0 (so dp * ep = D streams for every stage, m = B)."""
    vs = u.variants
    cuts = [(k, i) for k, i, _, _ in r.stages]
    ks = [r.knob(j, knobs) for j in range(len(r.stages))]
    v0, p = vs[0], len(cuts)
    out = make_plan(problem, "alpa_e", v0, p, r.D // v0.ep, cuts, [z for z, _ in ks],
                    [m for _, m in ks], "replica_major")
    if all(v == v0 for v in vs):
        return out, ""
    sizes = [r.D * v.tp * v.cp for v in vs]
    offs, aligned = submesh_offsets(sizes, problem.cluster.levels[0].devices_per_group)
    stages = tuple(
        replace(s, num_devices=n, device_ids=tuple(range(o, o + n)),
                **({} if v == v0 else dict(tp=v.tp, sp=v.sp, ep=v.ep, cp=v.cp)))
        for s, v, n, o in zip(out.stages, vs, sizes, offs))
    note = "" if aligned else "a submesh straddles nodes (the node size is not a power of two)"
    return out.with_(stages=stages, placement="custom"), note


def _first_feasible(problem: Problem, order, knobs, failed: list):
    for r, u, what in order:
        gap = contract_gap(problem, r, u)
        if gap:
            failed.append(f"{what} D={r.D}: not expressible in the plan contract ({gap})")
            continue
        out, note = to_plan(problem, r, u, knobs)
        ev = evaluate(out, problem)
        if ev.feasible:
            return out, r, u, what, note
        failed.append(f"{what} D={r.D} [{r.describe(u.variants)}]: {ev.reason}")
    return None


def plan(problem: Problem, settings: dict):
    cfg = merged_settings("alpa_e", settings, DEFAULTS)
    t0 = time.perf_counter()
    budget = Budget(cfg["max_dp_passes"])
    cl, N = problem.cluster, problem.num_devices
    M = cl.levels[0].devices_per_group
    if N > M and N % M:
        raise NoPlan(f"Alpa's 2-D mesh needs whole nodes: {N} devices, {M} per node")
    mesh, knobs, tb = mesh_view(cl), _knobs(cfg), cfg["compute_tiebreak"]
    notes, order, capped = [], [], False
    # 1. Alpa itself: per-stage submeshes, per-layer shardings
    try:
        kept: dict = {}  # the sharding tables of pass 1, read again by pass 2
        own = alpa(problem, cfg, mesh, False, budget, kept)
        if own is not None:
            n, bad = verify_with_highs(own, tb)
            notes.append(f"HiGHS re-solved {n} stage ILP(s) of Alpa's optimum"
                         + (f" ({bad} disagree with the chain DP)" if bad else ""))
            u = own.uniform(tb)
            if u is not None:
                order.append((own, u, "Alpa's optimum"))
            else:
                # 2. a stage mixes shardings: the ILP restricted to one variant per stage
                notes.append(f"Alpa's optimum (objective {own.T:.6g} s, B={own.B}, D={own.D}: "
                             f"{own.describe()}) mixes sharding options across the layers of a "
                             f"stage: per-layer resharding inside a stage is not expressible in "
                             f"the plan contract (one variant per stage)")
                one = alpa(problem, cfg, mesh, True, budget, kept)
                if one is not None:
                    order.append((one, one.uniform(tb), "Alpa with one variant per stage"))
                else:
                    notes.append("Alpa with one variant per stage finds no plan that fits memory")
    except Capped:
        capped = True
        notes.append(f"Alpa's DP over submeshes spent its budget of {cfg['max_dp_passes']} "
                     f"passes")
    # 3. the best single-variant plans, in Alpa's order (also the fall-back list): pick the
    # fastest, check memory with the shared evaluator, fall back
    failed: list[str] = []
    chosen = _first_feasible(problem, order, knobs, failed)
    if chosen is None:
        singles, shapes = single_variant(problem, cfg, mesh)
        singles.sort(key=lambda r: (r.T, r.D, r.groups[0][0][0].key))
        order = [(r, r.uniform(tb), "best single-variant plan") for r in singles]
        chosen = _first_feasible(problem, order, knobs, failed)
        if chosen is None and not shapes:
            raise NoPlan(f"Alpa-E: no submesh shape and micro-batch split lets one pipeline of "
                         f"at most {problem.graph.num_layers} stages (one per layer) cover all "
                         f"{N} devices with any single variant (Alpa leaves no device idle)")
        if chosen is None and failed:
            raise NoPlan(f"Alpa-E: every plan failed the evaluator's memory check ({failed[0]})")
        if chosen is None:
            raise NoPlan(f"Alpa-E: no slicing of the model onto submeshes covering all {N} "
                         f"devices fits memory (checked after sharding; configs ZeRO "
                         f"{cfg['zero_stages']} x remat {cfg['recompute_modes']})")
    out, r, u, what, note = chosen
    if failed:
        notes.append(f"{len(failed)} faster plan(s) failed the evaluator's check: "
                     + "; ".join(failed[:3]))
    shape = ("heterogeneous stages (per-stage variants / submeshes): " + r.describe(u.variants)
             if out.heterogeneous or len({s.num_devices for s in out.stages}) > 1 else
             f"one variant and one submesh size for every stage: {r.describe(u.variants)}")
    head = f"{what}: objective {u.T:.6g} s, B={r.B}, D={r.D}; {shape}"
    if u.ties:
        head += (f"; {u.ties} stage(s) whose ILP sharding mixes options run a single option of "
                 f"equal ILP objective (latency re-estimated)")
    if note:
        head += f"; {note}"
    notes.insert(0, head)
    fallback = None if what == "Alpa's optimum" and not failed else (
        f"{what}" + (f" ({len(failed)} faster plan(s) failed the memory check)" if failed else "")
        + ("; Alpa's own optimum mixes shardings inside a stage"
           if what == "Alpa with one variant per stage" else "")
        + ("; search budget spent" if capped else ""))
    return out.with_(predicted_time_per_batch_s=u.T, solve_time_s=time.perf_counter() - t0,
                     notes=("BUDGET SPENT: " if capped else "") + "; ".join(notes),
                     extra={"budget_exhausted": capped, "fallback": fallback,
                            "dp_passes": int(cfg["max_dp_passes"]) - budget.left})
