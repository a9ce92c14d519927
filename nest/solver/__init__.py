"""The NEST solver: an exact, network- and memory-aware dynamic program (JAX) over the plan space.

Search space (nest.problem.space, declared once; with settings {mbs_options: [1, 2, 4, 8]} also the
micro-batch size, one DP per size): the sub-graph variant (tp, sp, ep, cp) shared by all
stages, or with heterogeneous_stages one per stage among a class of variants of the same width and
ep (the variant is then part of each stage's option); the number of stages p; the data-parallel degree d with p * d * tp*ep*cp <= N (devices may
stay idle; m = ceil(global_batch / (mbs * d * ep)) micro-batches); contiguous cuts anywhere
between layers (uneven stages); per stage a ZeRO stage and a recomputation mode; the placement of
stages and replicas on the hierarchy (the space's placements: replica-major, stage-major, any rank
order, or every order a launcher can express, nest.problem.placement). Every cost is the stage kernel's
(nest.costs.stage) on the whole grid of cuts, through nest.solver.arrays.

Objective: exactly the shared evaluator's time per batch (nest.costs.pipeline.objective_s),
    T = C * max_j t_j + max_j u_j      (the paper's form, C = bottleneck_weight),
t_j the stage's time per micro-batch, u_j its gradient sync + optimizer step: the evaluator under
the default training settings (pipeline_time: paper, dp_overlap: none). With pipeline_time: dapple
the objective is DAPPLE's form plus max_j u_j, solved exactly per candidate by nest.solver.tight
(the compute-only and memory-aware bounds scaled by m / C, the joint bound taken with m in place
of C: both lower bounds of that form, which is at least m max t + max u). u_j holds whatever the stage kernel leaves after the
flush, so tp_comm_overlap (inside t_j) and param_gather_overlap (the exposed part of the weights'
all-gather, inside u_j) are optimised exactly too. With dp_overlap: stage | bucketed and the
paper's form the objective is C max t + max(0, max_j (e_j - D_j)), each stage's sync
credited with the drain of the stages before it, solved exactly by nest.solver.overlap. Under the
other settings (pipeline_time critical_path / simulated; dapple with an overlapped sync) the
evaluator prices a plan at most the objective optimised (the paper's or DAPPLE's form with the
sync after the flush), so the plan found is the optimum of that upper bound, re-scored; the
summary's schedule check reports how far the two are apart on the figures' plans. Network awareness:
for a fixed (variant, p, d, placement) every stage position j has known devices, so every
collective and every pipeline transfer is priced at the level it actually crosses (the paper's
"deferred forward cost" over levels is replaced by fixing the placement per DP: the transfer of
stage j depends on the device pair (j, j+1), known exactly).

Exactness with two maxima: the optimum lies on the Pareto frontier of (max t, max u). The solver
walks that frontier with two bottleneck DPs (nest.solver.dp): X_k = min max t s.t. u <= cap,
U_k = min max u s.t. t <= X_k, then cap = just below U_k; every frontier point is visited and
T = C X + U is minimised over them (epsilon-constraint method, Haimes et al. 1971).

Switches (planner settings, for the ablations of nest.experiments.decomposition; the defaults are NEST):
    network: real | flat   flat: plan on nest.network.collectives.flattened(cluster) (one
                           bandwidth, the innermost level's; no hierarchy, no oversubscription),
                           return the plan for the real cluster (the evaluator scores it there)
    even_cuts: false | true  true: every stage holds floor or ceil of blocks / p transformer blocks
                           (a mask on the DP's cells, nest.solver.arrays.even_cut_mask): exact over
                           everything else, including which stages take the extra blocks
Space restrictions (no ZeRO, no recomputation, one placement, ...) go through `space`.

Speed: (class, p, d) candidates are visited in order of lower bounds (nest.solver.bounds, each
relaxation stated there and property-tested against the exact optimum of every candidate), and the
search stops when the next bound reaches the best time found (branch and bound: exact, since no
bound exceeds its candidate's optimum; search(prune=False) visits everything, for tests).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time

import numpy as np

from nest.costs.memory import peak
from nest.costs.layers import layer_table
from nest.costs.pipeline import bottleneck_weight, held_bytes, paper_1f1b, solver_form, stash
from nest.costs.stage import Options, fixed_and_step_bytes
from nest.graph.layer_graph import Variant
from nest.problem.problem import Problem, with_mbs
from nest.common.errors import SpecError
from nest.costs.cache import read_only
from nest.network.collectives import flattened
from nest.solver.arrays import StageArrays, class_arrays, even_cut_mask
from nest.solver.bounds import compute_bounds, joint_minmax, memory_aware_bound, p2p_floor
from nest.solver.dp import bottleneck
from nest.solver.overlap import solve_fixed_overlap
from nest.common import progress
from nest.solver.tight import FORM as TIGHT_FORM
from nest.solver.tight import solve_fixed_tight
from nest.planners.ties import tie_record, tied_candidates
from nest.problem.space import SearchSpace, declare, make_plan, pp_dp_options


def solve_fixed(arr: StageArrays, C: float, best_T: float):
    """Exact min of C * max t + max u for one (variant, p, d, placement); (T, stages) or None."""
    u = arr.options.per_option(arr.u_JLLZ)
    t, ok = arr.t_JLLO, arr.ok_JLLO
    cap, best = math.inf, None
    while True:
        X, _ = bottleneck(t, u, ok, cap)
        if not math.isfinite(X) or C * X >= best_T:
            break
        U, _ = bottleneck(u, t, ok, X)
        if C * X + U < best_T:
            best_T, best = C * X + U, (X, U)
        cap = float(np.nextafter(U, -np.inf))
    if best is None:
        return None
    X, stages = bottleneck(t, u, ok, best[1])
    assert X == best[0]
    return best_T, stages


def solve_candidate(arr: StageArrays, p: int, best_T: float, form: str = "paper"):
    """Exact min of the objective `form` (the training settings' pipeline_time: "dapple", else
    the paper's) for one candidate: (T, stages) or None. With an overlapped gradient sync
    (arrays carrying the tail's terms) under the paper's form: nest.solver.overlap."""
    C = bottleneck_weight("paper", arr.num_microbatches, p)
    if arr.tail_JLLO is not None and form != TIGHT_FORM:
        return solve_fixed_overlap(arr.t_JLLO, arr.ok_JLLO, arr.tail_JLLO, arr.drain_JLLO,
                                   C, best_T)
    if form == TIGHT_FORM:
        return solve_fixed_tight(arr.t_JLLO, arr.options.per_option(arr.u_JLLZ), arr.ok_JLLO,
                                 arr.num_microbatches, best_T)
    return solve_fixed(arr, C, best_T)


def bound_scale(form: str, m: int, p: int) -> float:
    """Lower bounds are stated for the paper's form C max t + max u (C = m + p - 1,
    nest.costs.pipeline.bottleneck_weight); the tight form is at least m max t + max u >= m / C
    times that."""
    return m / bottleneck_weight("paper", m, p) if form == TIGHT_FORM else 1.0


def candidate_arrays(problem: Problem, space: SearchSpace, lts, p: int, d: int,
                     placement: str, even_cuts: bool = False) -> StageArrays:
    """The stage arrays of one candidate; with even_cuts, cells off the even split are masked."""
    arr = class_arrays(problem, space, lts, p, d, placement)
    if even_cuts:
        arr.ok_JLLO &= even_cut_mask(problem, p)[None, :, :, None]
    return arr


def _option_arrays(problem: Problem, space: SearchSpace, v: Variant):
    """(p, d, m) of `pp_dp_options` in its order, as int64 arrays, m the micro-batches of d;
    kept in the problem's cache by what they read (the searches per ZeRO stage and
    recomputation mode share them)."""
    def make():
        pd = np.array(list(pp_dp_options(problem, space, v)), dtype=np.int64).reshape(-1, 2)
        P, D = pd[:, 0], pd[:, 1]
        M = np.array([problem.num_microbatches(int(d), v.ep) for d in D], dtype=np.int64)
        return read_only((P, D, M))

    key = (v, space.max_pp, space.min_devices)
    return problem.cache.get("pp_dp_options", key, make)


def _bounds_pp(problem: Problem, space: SearchSpace, v: Variant, P: np.ndarray) -> int:
    """The largest p compute_bounds covers for candidates P: theirs, or with a min_devices the
    space's without it (X_lb[p] does not depend on how far the table goes, nest.solver.dp), so
    the search on all devices (nest.interfaces.cli_run) reads the table the search without it
    kept."""
    if space.min_devices:
        top = _option_arrays(problem, space.with_(min_devices=0), v)[0]
        if len(top):
            return int(top.max())
    return int(P.max())


def _memory_bound(problem: Problem, space: SearchSpace, lts, p: int, floor_LLR, send_floors
                  ) -> float:
    """memory_aware_bound of (class, p), kept in the problem's cache by all it reads: the
    class's variants and modes, p, the space's ZeRO stages, whether its replicas are aligned
    blocks (the floors of compute_bounds) and its placements (p2p_floor's sends); the searches
    per recomputation mode, and on all devices, share it."""
    from nest.solver.bounds import replica_blocks_aligned

    key = (tuple(lt.variant for lt in lts), lts[0].modes, p, space.zero_stages,
           replica_blocks_aligned(space), space.placements)
    return problem.cache.get("memory_aware_bound", key, lambda: memory_aware_bound(
        problem, space, lts, p, floor_LLR, send_floors))


def _joint(problem: Problem, space: SearchSpace, lts, p: int, d: int, stop_at: float,
           floors: dict | None = None) -> float:
    """joint_bound (nest.solver.bounds) with stop_at, or a value the search treats the same,
    from a min-max kept in the problem's cache by all it reads (the class's variants and modes,
    the space's options and placements (launch_node filters them: placements_for), p, d) with the stop it was priced at. The search pops a
    level-2 entry only below its best time, which never rises above stop_at: a value at or above
    stop_at is never popped, whichever it is. A fresh min-max M' with stop s' is exact (B) where
    B < s' and at least B elsewhere (nest.solver.bounds.joint_minmax), so from a kept (M, s):
    M < s is B itself: below s' it is what a fresh call returns; if M (1 - 1e-12) >= s', so is
    any fresh value (M' >= B, rounding monotone): neither is popped. M >= s means B >= s: if
    s (1 - 1e-12) >= s', a fresh value is at least that and the kept one too: neither is popped.
    Otherwise it is priced again (and kept with its stop). The search on all devices
    (nest.interfaces.cli_run) reads most of its joint bounds so. floors: lower bounds per
    placement (`_union_floor`'s), passed to joint_minmax (its value keeps the contract above)."""
    memo = problem.cache.get("joint_minmax", joint_key(space, lts, p, d), dict)  # {"m": min-max, "s": its stop}
    if memo:
        M, s = memo["m"], memo["s"]
        slack = M * (1 - 1e-12)
        if (M < s and (M < stop_at or slack >= stop_at)) or (
                M >= s and s * (1 - 1e-12) >= stop_at):
            return slack
    M = joint_minmax(problem, space, lts, p, d, stop_at, floors)
    memo.update(m=M, s=stop_at)
    return M * (1 - 1e-12)


UNION_SLACK = 1e-9  # relative: absorbs any rounding between the union's prices and a knob's


def _union_floor(problem: Problem, union: SearchSpace, lts, p: int, d: int, stop_at: float
                 ) -> float:
    """A lower bound of the joint min-max (joint_minmax, before its slack) of (class, p, d)
    under every knob space of `union` (one ZeRO stage and recomputation mode each, as
    nest.solver.launchable.search_launchable runs them; lts: the class's tables of all of
    union's modes). The union's joint min-max B_all takes each stage position's least price
    over every (z, r) that fits, so it is at most any knob's B_k (the same kernel prices; the
    relative UNION_SLACK covers rounding between the union's grids and a knob's); priced with
    stop s, its value J is B_all where below s and B_all >= s elsewhere, so
    min(J, s) (1 - UNION_SLACK) <= B_k. Kept per (class, modes, options, placements, p, d)
    with its stop: reused at a stop at most the kept one (a lower stop gives no larger
    floor), priced again above it.

    Per placement alike (`union_placement_floors`): its union min-max J_P, priced with stop
    s_P, is B_all,P where below s_P and B_all,P >= s_P elsewhere, so min(J_P, s_P) (1 -
    UNION_SLACK) is at most the knob's min-max of that placement."""
    memo = problem.cache.get("union_joint", joint_key(union, lts, p, d), dict)  # {"f": floor, "s": its stop, "P": ..}
    if memo and memo["s"] >= stop_at:
        return memo["f"]
    s = stop_at * (1 + UNION_SLACK)
    record: dict = {}
    J = joint_minmax(problem, union, lts, p, d, s, None, record)
    memo.update(f=min(J, s) * (1 - UNION_SLACK), s=stop_at, P={
        pl: min(v, st) * (1 - UNION_SLACK) for pl, (v, st) in record.items()})
    return memo["f"]


def union_placement_floors(problem: Problem, union: SearchSpace, lts, p: int, d: int
                           ) -> dict | None:
    """{placement: a lower bound of every knob's min-max of that placement} kept by the last
    `_union_floor` of (class, p, d) (lts: the class's tables of all of union's modes), or None
    if it was not priced."""
    return problem.cache.get("union_joint", joint_key(union, lts, p, d), dict).get("P")


def joint_key(space: SearchSpace, lts, p: int, d: int) -> tuple:
    """The cache key of a joint min-max of (class, p, d) in `space` ("joint_minmax": `_joint`;
    "union_joint": `_union_floor` of the union space): all it reads (the class's variants and
    modes, the space's options and placements, launch_node filtering them, p, d)."""
    return (tuple(lt.variant for lt in lts), lts[0].modes, space.options, space.placements,
            space.launch_node, p, d)


def num_blocks(problem: Problem) -> int:
    return sum(la.kind == "block" for la in problem.graph.layers)


def search(problem: Problem, space: SearchSpace, log=None, prune: bool = True,
           even_cuts: bool = False, incumbent: float = math.inf,
           union: SearchSpace | None = None):
    """The optimum plan of the space and statistics; best = (stage variants, p, d, placement,
    [(first, last, option)]) or None if nothing fits. even_cuts: only the most even splits of the
    blocks (p <= blocks); the bounds stay valid (they bound the unrestricted optimum, which is
    no larger).

    Candidates (class, p, d) -- a class is the variants a stage may pick (nest.problem.space) -- are
    popped from a heap by lower bound (nest.solver.bounds): first the compute-only bound (one DP
    for all p), refined on first pop by the memory-aware bound of (class, p), then, when popped
    again (still below the best time), by the joint bound of (class, p, d), and solved when
    popped a third time. Every entry whose bound is at most a popped one's is popped first (the
    level breaks ties), so deferring the joint bound to its candidate's turn visits the
    candidates a refinement on first pop would, in the same order; it is just computed later,
    with a better best time to stop at, or not at all. prune=False visits every candidate (for
    tests: the same optimum). incumbent: a time already achieved elsewhere (another space's
    plan): only plans strictly faster are returned (best None if there is none). union: a
    space of which this one is a knob (one ZeRO stage and recomputation mode of union's, the
    same variants and placements; nest.solver.launchable): before a candidate's joint bound,
    the union's (`_union_floor`, priced once per (class, p, d) for all knobs) is asked; where
    it shows the joint bound would reach the best time (floor (1 - 1e-12) >= best time: so is
    the joint bound, at least its floor), the candidate is dropped, as the joint bound's entry
    would never be popped: the same candidates visited, in the same order."""
    best_T, best = incumbent, None
    heap: list = []
    lts, refined, floors, sends, ults = {}, {}, {}, {}, {}
    form = solver_form(problem.training)
    classes = space.classes  # a property: computed once here
    for ci, cls in enumerate(classes):
        lts[ci] = [layer_table(problem, v, space.recompute_modes) for v in cls]
        if union is not None:
            ults[ci] = [layer_table(problem, v, union.recompute_modes) for v in cls]
        P, D, M = _option_arrays(problem, space, cls[0])
        if not len(P):
            continue
        lb, floors[ci] = compute_bounds(problem, space, lts[ci], _bounds_pp(problem, space,
                                                                           cls[0], P))
        sends[ci] = p2p_floor(problem, lts[ci], space)
        if even_cuts:
            keep = P <= num_blocks(problem)
            P, D, M = P[keep], D[keep], M[keep]
        if prune:  # elementwise over the candidates
            bound = paper_1f1b(np.asarray(lb)[P], M, P) * bound_scale(form, M, P)
        else:
            bound = np.zeros(len(P))
        heap.extend(zip(bound.tolist(), itertools.repeat(0), itertools.repeat(ci),
                        P.tolist(), D.tolist()))
    num_candidates = len(heap)
    heapq.heapify(heap)
    visited = 0
    while heap and (heap[0][0] < best_T or not prune):
        bound, level, ci, p, d = heapq.heappop(heap)
        cls = classes[ci]
        if prune and level == 0:  # cheaper bounds first
            if (ci, p) not in refined:
                refined[(ci, p)] = _memory_bound(problem, space, lts[ci], p, floors[ci],
                                                 sends[ci])
            m = problem.num_microbatches(d, cls[0].ep)
            bound = paper_1f1b(refined[(ci, p)], m, p) * bound_scale(form, m, p)
            heapq.heappush(heap, (bound, 1, ci, p, d))
            continue
        if prune and level == 1:
            if union is not None and math.isfinite(best_T) and _union_floor(
                    problem, union, ults[ci], p, d, best_T) * (1 - 1e-12) >= best_T:
                continue  # its joint bound reaches best_T: never popped again
            bound = max(bound, _joint(problem, space, lts[ci], p, d, best_T, None if union is None
                                      else union_placement_floors(problem, union, ults[ci], p, d)))
            heapq.heappush(heap, (bound, 2, ci, p, d))
            continue
        for placement in space.placements_for(cls[0], p, d):
            arr = candidate_arrays(problem, space, lts[ci], p, d, placement, even_cuts)
            visited += 1
            progress.update(visited, num_candidates, "candidates x placements visited")
            res = solve_candidate(arr, p, best_T, form)
            if res is not None and res[0] < best_T:
                O = space.options.size
                stages = [(a, b, o % O) for a, b, o in res[1]]
                variants = [cls[o // O] for _, _, o in res[1]]
                best_T, best, best_ci = res[0], (variants, p, d, placement, stages), ci
                if log:
                    log(f"  better: T={best_T:.6g} s  {'/'.join(v.key for v in variants)} p={p} "
                        f"d={d} {placement}")
    stats = {"candidates": num_candidates, "visited": visited, "tied": []}
    if best is not None:  # ties go to the placement its user launches (nest.planners.ties)
        stats["tied"] = tied_candidates(problem, space, classes[best_ci], lts[best_ci],
                                        best, best_T, form, even_cuts)
        best_T, best = stats["tied"][0]
    return best_T, best, stats


def candidate_optimum(problem: Problem, space: SearchSpace, cls, p: int, d: int,
                      even_cuts: bool = False) -> float:
    """The exact optimum time per batch of one candidate (a variant, or a class of variants the
    stages pick from) over every cut, option and placement of the space (inf if nothing fits):
    what every bound of nest.solver.bounds must not exceed."""
    cls = [cls] if isinstance(cls, Variant) else list(cls)
    lts = [layer_table(problem, v, space.recompute_modes) for v in cls]
    best = math.inf
    for placement in space.placements_for(cls[0], p, d):
        arr = candidate_arrays(problem, space, lts, p, d, placement, even_cuts)
        res = solve_candidate(arr, p, best, solver_form(problem.training))
        if res is not None:
            best = min(best, res[0])
    return best


def plan_of(problem: Problem, space: SearchSpace, planner: str, best):
    """The plan of a `search` result."""
    variants, p, d, placement, stages = best
    cuts = [(a, b) for a, b, _ in stages]
    zero = [space.options.decode(o)[0] for _, _, o in stages]
    rec = [space.options.decode(o)[1] for _, _, o in stages]
    return make_plan(problem, planner, variants[0], p, d, cuts, zero, rec, placement,
                     variants if len(set(variants)) > 1 else None)


SWITCHES = {"network": ("real", "flat"), "even_cuts": (False, True)}


def switches(settings: dict) -> tuple[bool, bool]:
    """(flat network, even cuts) of the planner settings; a bad value is a SpecError naming it."""
    for key, allowed in SWITCHES.items():
        value = settings.get(key, allowed[0])
        if value not in allowed or type(value) is not type(allowed[0]):
            raise SpecError(f"config/planners.yaml: key 'settings.{key}': {value!r}, expected one "
                            f"of {list(allowed)}")
    return settings.get("network", "real") == "flat", bool(settings.get("even_cuts", False))


def plan(problem: Problem, settings: dict):
    from nest.planners.registry import NoPlan

    flat, even = switches(settings)
    if settings.get("launchable"):
        return plan_launchable(problem, settings)
    real = problem
    # the network the search sees: the real one, or its flattened view (the returned plan is the
    # real problem's, so run_planner's evaluator scores it on the real network)
    seen = problem.with_cluster(flattened(problem.cluster)) if flat else problem
    options = mbs_sizes(seen, settings)  # [seen.mbs] without mbs_options
    if seen.mbs not in options:  # only the options, never the problem's own
        seen = with_mbs(seen, options[0])
    first = seen.mbs
    space = declare(seen, settings.get("space"))
    t0 = time.perf_counter()
    best_T, best, stats = search(seen, space, even_cuts=even)
    for mbs in options:  # search the micro-batch size when asked
        if mbs == first:
            continue
        other = with_mbs(seen, mbs)
        T, found, st = search(other, declare(other, settings.get("space")), even_cuts=even)
        stats = {k: stats[k] + st[k] for k in ("candidates", "visited")} | {
            "tied": stats["tied"]}
        if found is not None and T < best_T:
            best_T, best, seen, space = T, found, other, declare(other, settings.get("space"))
            stats["tied"] = st["tied"]
    if best is None:
        raise NoPlan(infeasibility_reason(seen, space, even))
    if seen.mbs != real.mbs:
        real = with_mbs(real, seen.mbs)
    out = plan_of(real, space, "nest", best)
    if len(stats["tied"]) > 1:  # the range over the tied plans, scored on the real cluster
        out = out.with_(extra={"tied": tie_range(real, space, stats["tied"])})
    notes = (f"visited {stats['visited']} of {stats['candidates']} (variant, p, d) candidates"
             f" x placements")
    if flat:
        notes = (f"planned on the flattened network (one bandwidth of "
                 f"{seen.cluster.levels[0].bytes_per_s / 1e9:g} GB/s): predicted "
                 f"{best_T:.6g} s there; " + notes)
    if even:
        notes = "even cuts; " + notes
    if len(stats["tied"]) > 1:
        notes += (f"; placements {', '.join(b[3] for _, b in stats['tied'])} tied under the "
                  f"objective (nest.planners.ties): the first kept")
    return out.with_(predicted_time_per_batch_s=best_T, solve_time_s=time.perf_counter() - t0,
                     notes=notes)


def mbs_sizes(problem: Problem, settings: dict) -> list[int]:
    """The micro-batch sizes a search covers: settings' `mbs_options` when given (those that
    divide the global batch, and only those: `nest plan --mbs-options 2,4` never plans with the
    problem's mbs 1), else the problem's own; NoPlan (kind batch) when no option divides it."""
    from nest.planners.registry import NoPlan

    opts = [int(m) for m in settings.get("mbs_options") or ()]
    if not opts:
        return [problem.mbs]
    gb = problem.training.global_batch
    ok = sorted({m for m in opts if gb % m == 0})
    if not ok:
        raise NoPlan(f"global batch {gb} is not a multiple of any micro-batch size searched "
                     f"({', '.join(map(str, opts))}): no plan processes exactly the global batch "
                     f"(choose sizes dividing it)", kind="batch")
    return ok


def plan_launchable(problem: Problem, settings: dict):
    """The launchable optimum (nest.solver.launchable): one variant, ZeRO stage and recomputation
    mode for all stages, 1F1B or interleaved, the micro-batch size among settings' mbs_options."""
    from nest.planners.registry import NoPlan
    from nest.solver.launchable import launchable_space, search_launchable

    t0 = time.perf_counter()
    best_T, best, stats, pr = search_launchable(problem, settings)
    if best is None:  # the message names the space searched
        space = launchable_space(declare(problem, {**(settings.get("space") or {}),
                                                   "heterogeneous_stages": False}), problem)
        raise NoPlan(infeasibility_reason(problem, space))
    notes = (f"launchable space (one variant, ZeRO stage and recomputation for all stages; 1F1B "
             f"or interleaved): visited {stats['visited']} of {stats['candidates']} 1F1B "
             f"candidates x placements, priced {stats['interleaved']} interleaved plans in full (the "
             f"others screened out by their floor bound or memory)")
    if len(stats["tied"]) > 1:  # the range over the tied placements, as plan() records it
        best = best.with_(extra={"tied": tie_range(pr, stats["tied_space"], stats["tied"])})
    return best.with_(predicted_time_per_batch_s=best_T, solve_time_s=time.perf_counter() - t0,
                      notes=notes)


def tie_range(real: Problem, space: SearchSpace, tied) -> dict:
    """plan.extra["tied"] (nest.planners.ties.tie_record): every tied plan scored by the shared evaluator
    on the real cluster."""
    from nest.problem.evaluate import evaluate

    scored = []
    for _, b in tied:
        ev = evaluate(plan_of(real, space, "nest", b), real)
        scored.append((b[3], ev.time_per_batch_s if ev.feasible else None))
    return tie_record(scored)


def infeasibility_reason(problem: Problem, space: SearchSpace, even_cuts: bool = False) -> str:
    """Name the layer that fits nowhere and the least memory it would need: the layer alone on a
    stage at the pipeline's end (one micro-batch stashed), ZeRO-3 over the most replicas, full
    recomputation, the best variant (the stage kernel's memory model). If every layer would fit
    so but the space lacks ZeRO-3 or full recomputation or cuts evenly (an ablation's space),
    say which restrictions leave nothing that fits."""
    hw = problem.cluster.hardware
    need = None
    for v in space.variants:
        if v.width > problem.num_devices:
            continue
        d = problem.num_devices // v.width
        lt = layer_table(problem, v, ("full",))
        i = np.arange(lt.num_layers)
        alloc, step = fixed_and_step_bytes(problem, lt, d, Options((3,), ("full",)), (i, i))
        mem = peak(held_bytes(alloc[:, 0, 0], stash(2, 1, 1), lt.act_LLR[i, i, 0],
                              step[:, 0, 0]), hw)  # last stage
        need = mem if need is None else np.minimum(need, mem)
    if need is None:
        if not space.variants:
            return "the search space holds no sub-graph variant of the model"
        return f"every variant needs more than the {problem.num_devices} devices"
    i = int(np.argmax(need))
    if need[i] > hw.hbm_bytes:
        return (f"no plan fits in {hw.hbm_bytes / 1e9:.2f} GB per device even with ZeRO-3 and "
                f"full recomputation: layer {i} ({problem.graph.layers[i].name}) alone needs at "
                f"least {need[i] / 1e9:.2f} GB")
    limits = [f"ZeRO stages {list(space.zero_stages)}", f"recomputation "
              f"{list(space.recompute_modes)}", f"placements {list(space.placements)}",
              _variants_text(space.variants)]
    if not space.heterogeneous:
        limits.append("one variant for all stages")
    if even_cuts:
        limits.append(f"even cuts (at most {num_blocks(problem)} stages)")
    return (f"no plan of the space fits in {hw.hbm_bytes / 1e9:.2f} GB per device ("
            + ", ".join(limits) + f"); every layer alone would fit with ZeRO-3 and full "
            f"recomputation (the largest needs {need[i] / 1e9:.2f} GB)")


def _variants_text(variants) -> str:
    """The space's variants for a message: their keys when few, else how many and the values
    of each dimension (Qwen2-57B-A14B's 168 keys made a 6,000-character line)."""
    keys = [v.key for v in variants]
    if len(keys) <= 8:
        return f"variants {keys}"
    dims = {name: sorted({getattr(v, name) for v in variants}) for name in ("tp", "ep", "cp")}
    sp = sorted({bool(v.sp) for v in variants})
    return (f"{len(keys)} variants (" + ", ".join(f"{k} {'/'.join(map(str, x))}"
                                                  for k, x in dims.items())
            + f", sp {'/'.join('on' if x else 'off' for x in sp)})")

