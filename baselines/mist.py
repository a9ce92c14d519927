"""Mist-style planner: per-stage layer counts and memory knobs by a MILP (HiGHS), network-blind.

Follows Zhu et al. 2025, "Mist: Efficient Distributed Training of Large Language Models via
Memory-Parallelism Co-Optimization" (EuroSys '25), its imbalance-aware hierarchical tuning:
  * outer search (brute force, as Mist's): sub-graph variant, pipeline stages p, data-parallel
    degree d, hence m = ceil(global_batch / (mbs * d * ep)) micro-batches;
  * intra-stage tuning: for every stage position j and layer count n, the memory knobs (ZeRO stage,
    recomputation) that fit in HBM at that position (its stash of activations,
    nest.costs.pipeline.stash), reduced to their Pareto frontier in (steady-state time t, after-flush time u):
    Mist's "Pareto frontier sampling" between its two levels, with u playing Mist's
    first/last-micro-batch imbalance term;
  * inter-stage tuning, the MILP: binaries x[j, k] pick one candidate k = (n, z, r) per stage,
        min  C X + U       (the paper's form, C = m + p - 1; pipeline_time: dapple adds
                            sum_j t_j and C = m - 1; nest.costs.pipeline)
        s.t. sum_k x[j, k] = 1                          every stage j takes one candidate
             sum_{j,k} n_k x[j, k] = number of blocks   layer counts add up
             sum_k t[j, k] x[j, k] <= X                 X = slowest stage's time per micro-batch
             sum_k u[j, k] x[j, k] <= U                 U = slowest gradient sync + optimizer step
             sum_k mem[j, k] x[j, k] <= HBM             peak memory at position j (linear in x)
    with dp_overlap stage | bucketed, U is the overlapped tail instead: U >= 0 and
    U >= e_j - sum_{i<j} r_i (linear in x; nest.costs.stage.overlap_terms);
    solved exactly (zero gap) by HiGHS (highspy); the objective is the shared evaluator's time
    per batch under the training settings (nest.costs.pipeline.objective_s; critical_path and
    simulated through the paper's form, their upper bound), so on a flat network the MILP
    optimum is the evaluator's time.
Every time and memory figure comes from the harness's cost arrays (nest.solver.arrays, the
vectorised twin of the evaluator) built on `flattened(cluster)`: one flat bandwidth, no
hierarchy, no oversubscription (Mist's network-unaware cost model). The chosen plan is then scored
on the real network by the shared evaluator.

Deliberate deviations from Mist (each one maps Mist into the harness's declared space, so the
result is a plan of that space and can never beat NEST, the exact optimum of it):
  * one variant (tp, sp, ep, cp) and one d for all stages; Mist may give each stage its own device
    count and (dp, tp) shape. By default stages use all devices (p * d * tp*ep*cp = N, as Mist's
    sum-of-stage-devices constraint); `full_device_use: false` also tries every smaller d.
  * EP / CP variants are searched too (Mist supports neither; the NEST paper leaves Mixtral out of
    its Mist comparison); we keep them so Mist has a point on every Figure 5 model.
  * knobs are the space's: ZeRO 0-3 and recomputation none / selective / full per stage. Mist's
    offloading ratios, per-layer checkpoint counts and compute-communication overlap are not
    modelled: the shared evaluator does not model them, so the MILP would mis-predict.
  * the objective is the evaluator's (the paper's form: C max_j t_j + max_j u_j) rather than Mist's own
    imbalance-aware pipeline formula (which it becomes when warm-up and cool-down micro-batches
    cost the steady-state time and the imbalance term is the after-flush sync + optimizer).
  * stages keep the Megatron rank order (`replica_major` placement); Mist does not choose a
    placement, and its flat network barely tells placements apart (only per-hop latencies of
    hierarchical collectives differ; bandwidth terms are identical).
  * layer counts price identical transformer blocks (Mist's assumption); for a graph whose blocks
    differ the MILP prices each count from one representative range and says so in the notes.
  * the micro-batch size is the problem's (the harness fixes it per figure): Mist's loop over
    micro-batch size and gradient-accumulation steps reduces to m = ceil(B / (mbs * d * ep)).
  * outer candidates are visited in order of a compute-only lower bound and skipped once the bound
    reaches the best time found (exact pruning, speed only). The budgets are counts, never
    wall-clock time: at most `max_candidates` MILPs, each at most `milp_max_nodes` branch-and-
    bound nodes (HiGHS on one thread with a fixed seed is deterministic), so the same inputs give
    the same plan on any machine; a spent budget is reported (plan.extra["budget_exhausted"]).
"""

from __future__ import annotations

import itertools
import math
import os
import sys
import time
from dataclasses import dataclass

import highspy
import numpy as np

from nest.costs.pipeline import bottleneck_weight, links, objective_s, solver_form, stash
from nest.problem.problem import Problem
from nest.network.collectives import flattened
from nest.planners.registry import NoPlan, merged_settings
from nest.costs.layers import layer_table
from nest.costs.stage import stage_cost
from nest.problem.plan import place
from nest.solver.dp import lower_bounds
from nest.problem.space import SearchSpace, declare, make_plan, pp_dp_options

PLACEMENT = "replica_major"  # Megatron-LM rank order: tp, cp, ep, dp fastest, pp outermost
# Budgets are safety stops, not tunings: a Figure 5/7 point has at most a few dozen (variant, p, d)
# candidates after pruning (Table 4: 1-16 solved of 6-35) and no point of the default run spends
# either budget (budget_exhausted in results/expected/default/).
DEFAULTS = {"max_candidates": 2000, "milp_max_nodes": 20000, "full_device_use": True}


@dataclass
class StageTable:
    """The MILP's candidates for one (variant, p, d): per stage j, parallel arrays over its
    candidates k = (n blocks, option o) with o = z_index * R + r_index (nest.solver.arrays)."""

    n: list[np.ndarray]
    o: list[np.ndarray]
    t: list[np.ndarray]  # seconds per micro-batch (flat network)
    u: list[np.ndarray]  # gradient sync + optimizer step after the flush, seconds
    mem: list[np.ndarray]  # peak bytes at the stage's pipeline position
    num_blocks: int
    C: int  # the bottleneck's weight (nest.costs.pipeline.bottleneck_weight): m + p - 1 (paper)
    hbm: float
    idx: list[np.ndarray] | None = None  # after `keep`: each candidate's index in the original
    form: str = "paper"  # the pipeline form optimised (nest.costs.pipeline.solver_form)
    # dp_overlap stage | bucketed: the kernel's overlapped-tail terms per candidate (the tail
    # max(0, max_j (e_j - sum_{i<j} r_i)) replaces max_j u_j; nest.costs.stage.overlap_terms)
    e: list[np.ndarray] | None = None
    r: list[np.ndarray] | None = None

    @property
    def p(self) -> int:
        return len(self.n)

    @property
    def m(self) -> int:
        """Micro-batches: C = m + p - 1 for the paper's form, C = m for DAPPLE's."""
        return self.C if self.form == "dapple" else self.C - self.p + 1

    def keep(self, masks: list[np.ndarray]) -> "StageTable":
        idx = self.idx or [np.arange(len(x)) for x in self.n]
        extra = (self.e, self.r) if self.e is not None else ()
        f = [[a[mk] for a, mk in zip(arrs, masks)]
             for arrs in (self.n, self.o, self.t, self.u, self.mem, idx, *extra)]
        return StageTable(*f[:5], self.num_blocks, self.C, self.hbm, f[5], self.form,
                          *(f[6:] if extra else ()))


def flat_problem(problem: Problem) -> Problem:
    """The same problem on a network-blind view of the cluster (one flat bandwidth)."""
    return problem.with_cluster(flattened(problem.cluster))


def canonical_range(j: int, p: int, n: int, num_blocks: int) -> tuple[int, int]:
    """The layer range (first, last) that prices stage j holding n blocks: the embedding (layer 0)
    is always on stage 0 and the head (layer num_blocks + 1) on stage p - 1."""
    last = num_blocks + 1
    if p == 1:
        return 0, last
    if j == 0:
        return 0, n
    if j == p - 1:
        return last - n, last
    a = 2 if n <= num_blocks - 1 else 1  # a block before and after, when the count allows
    return a, a + n - 1


def count_range(j: int, p: int, num_blocks: int) -> range:
    """Block counts stage j can hold: middle stages at least one, the others may hold none; the
    rest of the middle stages keep one block each."""
    if p == 1:
        return range(num_blocks, num_blocks + 1)
    middle = max(p - 2, 0)
    lo = 1 if 0 < j < p - 1 else 0
    return range(lo, num_blocks - (middle - lo) + 1)


def stage_table(flat: Problem, space: SearchSpace, la, v, p: int, d: int) -> StageTable:
    """Every candidate (n, o) of every stage position, priced on the flat network: the stage
    kernel (nest.costs.stage.stage_cost) at the cells canonical_range reads, from_grid (the
    position-free terms of the whole [b, a] grid, cached per group terms, then each position's
    sends and stash on those cells only: the elementwise arithmetic of the whole grid that
    nest.solver.arrays.stage_arrays prices, at a few cells of the L^2, its memory the kernel's
    peak there; tests/test_baseline_mist.py compares the table with the one read from
    stage_arrays and the peak computed from the whole grid's fixed bytes, array for array)."""
    hw = flat.cluster.hardware
    L = flat.graph.num_layers
    nb = L - 2
    R = len(space.recompute_modes)
    opts = space.options
    m = flat.num_microbatches(d, v.ep)
    ids = place(p, d, v.width, PLACEMENT, tp=v.tp, cp=v.cp, ep=v.ep)
    O = len(space.zero_stages) * R  # o = z R + r
    zi_O = np.arange(O) // R
    form = solver_form(flat.training)
    out = StageTable([], [], [], [], [], nb, bottleneck_weight(form, m, p), hw.hbm_bytes,
                     form=form)
    for j in range(p):
        ns = np.array(count_range(j, p, nb))
        ab = np.array([canonical_range(j, p, n, nb) for n in ns])
        a, b = ab[:, 0], ab[:, 1]
        c = stage_cost(flat, la, ids[j], d, opts, stash(p, j, m), cell=(a, b), from_grid=True,
                       **links(ids, j))
        mem = np.broadcast_to(c.mem, (len(ns), *c.mem.shape[1:])).reshape(len(ns), O)  # peak
        if j == 0 and c.tail is not None and form == "paper":  # the overlapped tail, exactly
            out.e, out.r = [], []
        out.n.append(np.repeat(ns, O))
        out.o.append(np.tile(np.arange(O), len(ns)))
        out.t.append(np.broadcast_to(c.t, (len(ns), *c.t.shape[1:])).reshape(-1))
        out.u.append(np.broadcast_to(c.u, (len(ns), c.u.shape[-1]))[:, zi_O].reshape(-1))
        out.mem.append(mem.reshape(-1))
        if out.e is not None:
            out.e.append(np.broadcast_to(c.tail, (len(ns), *c.tail.shape[1:])).reshape(-1))
            out.r.append(np.broadcast_to(c.drain, (len(ns), *c.drain.shape[1:])).reshape(-1))
    return out


def prune(tab: StageTable, cutoff: float = math.inf) -> StageTable:
    """Drop candidates no optimal solution strictly better than `cutoff` uses: those over HBM on
    their own (the memory row), those whose own lower bound on the objective (C t + u; with the
    overlapped tail C t, plus max(e, 0) on the first stage) reaches the cutoff, and those
    Pareto-dominated by another candidate of the same stage and count: in (t, u), or with the
    overlapped tail in (t, e, -r) (the objective is monotone in each)."""
    masks = []
    for j in range(tab.p):
        t, u, n = tab.t[j], tab.u[j], tab.n[j]
        if tab.e is None:
            keep = (tab.mem[j] <= tab.hbm) & (tab.C * t + u < cutoff)
            second, third = u, np.zeros_like(u)
        else:
            own = np.maximum(tab.e[j], 0.0) if j == 0 else 0.0
            keep = (tab.mem[j] <= tab.hbm) & (tab.C * t + own < cutoff)
            second, third = tab.e[j], -tab.r[j]
        idx = np.flatnonzero(keep)
        # sort by (n, t, second, third, o): within a count, a candidate survives iff no earlier
        # (no slower) survivor is at least as good in the other keys
        order = idx[np.lexsort((tab.o[j][idx], third[idx], second[idx], t[idx], n[idx]))]
        mask = np.zeros_like(keep)
        kept: list[int] = []
        prev_n = None
        for k in order:
            if n[k] != prev_n:
                kept, prev_n = [], n[k]
            if not any(second[i] <= second[k] and third[i] <= third[k] for i in kept):
                mask[k] = True
                kept.append(k)
        masks.append(mask)
    return tab.keep(masks)


def objective(tab: StageTable, choice: list[int]) -> float:
    """The exact objective of one candidate index per stage: the batch time of
    nest.costs.pipeline.objective_s in the table's form."""
    t = [tab.t[j][k] for j, k in enumerate(choice)]
    if tab.e is not None:
        return objective_s(tab.form, tab.m, t, e=[tab.e[j][k] for j, k in enumerate(choice)],
                           r=[tab.r[j][k] for j, k in enumerate(choice)])
    return objective_s(tab.form, tab.m, t, [tab.u[j][k] for j, k in enumerate(choice)])


def solve_milp(tab: StageTable, cutoff: float = math.inf, max_nodes: int = 20000):
    """The MILP of the module docstring with HiGHS: (T, choice, capped) with choice one candidate
    index per stage (T = inf and choice None when the node limit struck before any solution), or
    None if no assignment beats `cutoff`. DAPPLE's form adds sum_j t_j to the objective (weight
    m - 1 on X); with the overlapped tail, U is the tail: U >= e_j - sum_{i<j} r_i, U >= 0."""
    sub = prune(tab, cutoff)
    p = sub.p
    if any(len(x) == 0 for x in sub.n):
        return None
    sizes = [len(x) for x in sub.n]
    K = sum(sizes)
    scale = max(float(max(x.max() for x in sub.t)), 1e-30)  # times in units of the slowest
    iX, iU = K, K + 1
    rows: list[tuple[list[int], list[float], float, float]] = []
    start = np.concatenate([[0], np.cumsum(sizes)])
    for j in range(p):
        cols = list(range(start[j], start[j + 1]))
        rows.append((cols, [1.0] * len(cols), 1.0, 1.0))
        rows.append((cols + [iX], list(sub.t[j] / scale) + [-1.0], -highspy.kHighsInf, 0.0))
        if sub.e is None:
            rows.append((cols + [iU], list(sub.u[j] / scale) + [-1.0], -highspy.kHighsInf,
                         0.0))
        else:  # e_j - sum_{i<j} r_i - U <= 0
            before = list(range(start[j]))
            drain = [-x / scale for i in range(j) for x in sub.r[i]]
            rows.append((cols + before + [iU], list(sub.e[j] / scale) + drain + [-1.0],
                         -highspy.kHighsInf, 0.0))
        rows.append((cols, list(sub.mem[j] / tab.hbm), -highspy.kHighsInf, 1.0))
    allc = list(range(K))
    rows.append((allc, [float(x) for x in np.concatenate(sub.n)], tab.num_blocks,
                 tab.num_blocks))
    h = _highs()
    h.setOptionValue("threads", 1)
    h.setOptionValue("random_seed", 0)
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("mip_abs_gap", 0.0)
    h.setOptionValue("mip_max_nodes", int(max_nodes))
    if math.isfinite(cutoff):
        h.setOptionValue("objective_bound", cutoff / scale)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = K + 2, len(rows)
    if tab.form == "dapple":  # sum_j t_j + (m - 1) X + U
        lp.col_cost_ = np.concatenate([np.concatenate(sub.t) / scale, [tab.m - 1, 1.0]])
    else:
        lp.col_cost_ = np.concatenate([np.zeros(K), [tab.C, 1.0]])
    lp.col_lower_ = np.zeros(K + 2)
    lp.col_upper_ = np.concatenate([np.ones(K), [highspy.kHighsInf] * 2])
    lp.row_lower_ = np.array([r[2] for r in rows], dtype=float)
    lp.row_upper_ = np.array([r[3] for r in rows], dtype=float)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = np.concatenate([[0], np.cumsum([len(r[0]) for r in rows])]).astype(
        np.int32)
    lp.a_matrix_.index_ = np.concatenate([r[0] for r in rows]).astype(np.int32)
    lp.a_matrix_.value_ = np.concatenate([r[1] for r in rows]).astype(float)
    lp.integrality_ = [highspy.HighsVarType.kInteger] * K + [highspy.HighsVarType.kContinuous] * 2
    h.passModel(lp)
    h.run()
    status = h.getModelStatus()
    capped = status in (highspy.HighsModelStatus.kSolutionLimit,  # mip_max_nodes
                        highspy.HighsModelStatus.kIterationLimit,
                        highspy.HighsModelStatus.kInterrupt)
    x = np.asarray(h.getSolution().col_value)
    if len(x) < K or h.getInfo().primal_solution_status != 2:  # 2: feasible point
        return (math.inf, None, True) if capped else None
    local = [int(np.argmax(x[start[j]:start[j + 1]])) for j in range(p)]
    choice = [int(sub.idx[j][k]) for j, k in enumerate(local)]
    assert sum(int(tab.n[j][k]) for j, k in enumerate(choice)) == tab.num_blocks
    T = objective(tab, choice)
    if T >= cutoff:
        return None
    return T, choice, capped


def _highs() -> highspy.Highs:
    """A silent HiGHS instance (its constructor prints a banner on file descriptor 1 once per
    process, before any option can turn output off)."""
    global _BANNER_SHOWN
    if _BANNER_SHOWN:
        h = highspy.Highs()
    else:
        sys.stdout.flush()
        saved = os.dup(1)
        try:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 1)
                h = highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        _BANNER_SHOWN = True
    h.setOptionValue("output_flag", False)
    return h


_BANNER_SHOWN = False


def brute_force(tab: StageTable):
    """Plain enumeration of the MILP's own variables (for tests): every count vector that adds up
    to the blocks, every candidate of those counts per stage; (T, choice) or None."""
    best = None
    by_count = [{int(n): np.flatnonzero(tab.n[j] == n) for n in np.unique(tab.n[j])}
                for j in range(tab.p)]
    for counts in itertools.product(*[sorted(b) for b in by_count]):
        if sum(counts) != tab.num_blocks:
            continue
        for choice in itertools.product(*[b[c] for b, c in zip(by_count, counts)]):
            if any(tab.mem[j][k] > tab.hbm for j, k in enumerate(choice)):
                continue
            T = objective(tab, list(choice))
            if best is None or T < best[0]:
                best = (T, [int(k) for k in choice])
    return best


def candidates(problem: Problem, flat: Problem, space: SearchSpace, full_device_use: bool):
    """Mist's outer loop over (variant, p, d), each with a lower bound on its time: the
    compute-only bottleneck of p stages (cheapest recomputation, no communication, no memory)."""
    N = problem.num_devices
    out, las = [], {}
    for vi, v in enumerate(space.variants):
        if v.width > N:
            continue
        la = layer_table(flat, v, space.recompute_modes)
        las[vi] = la
        options = list(pp_dp_options(problem, space, v))  # the declared space's (p, d)
        if not options:
            continue
        c = np.concatenate([np.zeros(1), np.cumsum(la.comp_LR.min(axis=1))])
        lb = lower_bounds(c[1:, None] - c[None, :-1], max(p for p, _ in options))
        for p, d in options:
            if full_device_use and p * d * v.width != N:
                continue  # Mist's stages use every device
            m = problem.num_microbatches(d, v.ep)
            out.append((bottleneck_weight(solver_form(problem.training), m, p) * lb[p], vi, p,
                        d))
    if full_device_use and not out:  # N not a multiple of any p * width: leave the rest idle
        return candidates(problem, flat, space, False)
    out.sort(key=lambda c: (c[0], c[1], c[2], -c[3]))
    return out, las


def uniform_blocks(problem: Problem, v) -> bool:
    g = problem.graph
    first = g.layers[1].costs[v.key]
    return all(la.costs[v.key] == first for la in g.layers[2:-1]) and (
        g.layers[0].costs[v.key].output_bytes == first.output_bytes)


def plan(problem: Problem, settings: dict):
    cfg = merged_settings("mist", settings, DEFAULTS, also=("space",))
    space = declare(problem, settings.get("space")).with_(placements=(PLACEMENT,))
    t0 = time.perf_counter()
    if problem.graph.num_layers < 3:
        raise NoPlan("Mist-style planning needs an embedding, transformer blocks and a head")
    flat = flat_problem(problem)
    cands, las = candidates(problem, flat, space, bool(cfg["full_device_use"]))
    best_T, best, solved, capped = math.inf, None, 0, False
    for bound, vi, p, d in cands:
        if bound >= best_T:
            break  # sorted by bound: nothing later can beat the best
        if solved >= int(cfg["max_candidates"]):
            capped = True
            break
        v = space.variants[vi]
        tab = stage_table(flat, space, las[vi], v, p, d)
        res = solve_milp(tab, best_T, int(cfg["milp_max_nodes"]))
        solved += 1
        if res is None:
            continue
        capped |= res[2]
        if res[1] is not None and res[0] < best_T:
            best_T, best = res[0], (vi, p, d, tab, res[1])
    if best is None:
        why = ("spent its budget before a feasible plan was found" if capped else
               "no (variant, p, d) candidate has a stage assignment that fits in "
               f"{problem.cluster.hardware.hbm_bytes / 1e9:.2f} GB HBM")
        raise NoPlan(f"Mist-style MILP: {why} ({solved} of {len(cands)} candidates solved)")
    vi, p, d, tab, choice = best
    v = space.variants[vi]
    R = len(space.recompute_modes)
    counts = [int(tab.n[j][k]) for j, k in enumerate(choice)]
    opts = [int(tab.o[j][k]) for j, k in enumerate(choice)]
    cuts, first = [], 0
    for j, n in enumerate(counts):
        last = problem.graph.num_layers - 1 if j == p - 1 else first + n - (1 if j else 0)
        cuts.append((first, last))
        first = last + 1
    out = make_plan(problem, "mist", v, p, d, cuts, [space.zero_stages[o // R] for o in opts],
                    [space.recompute_modes[o % R] for o in opts], PLACEMENT)
    notes = (f"network-blind MILP prediction {best_T:.6g} s; solved {solved} of {len(cands)} "
             f"(variant, p, d) candidates")
    if not uniform_blocks(problem, v):
        notes += "; blocks differ: layer counts priced from one representative range"
    if capped:
        notes += "; BUDGET SPENT (max_candidates or milp_max_nodes): the best found so far"
    return out.with_(predicted_time_per_batch_s=best_T, solve_time_s=time.perf_counter() - t0,
                     notes=notes, extra={"budget_exhausted": capped, "milps": solved,
                                         "believed_time_per_batch_s": best_T})
