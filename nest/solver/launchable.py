"""Problem -> the fastest plan Megatron-LM launches exactly as priced (`nest plan`'s default space).

The launchable space (what nest.interfaces.export writes without projecting anything):
  * one sub-graph variant (tp, sp, ep, cp; not cp > 1 with ep > 1, nor under the unfused attention
    core: `launchable_space`) for every
    stage, one ZeRO stage and one recomputation
    mode for every stage (Megatron-LM applies --recompute-granularity and the distributed
    optimizer / Megatron-FSDP to the whole model);
  * either 1F1B with any contiguous cuts (--pipeline-model-parallel-layout expresses them, uneven
    first and last stages included), or interleaved 1F1B with v >= 2 model chunks per device
    group whose p v chunks hold k = ceil(blocks / (p v)) blocks each but the first (a blocks and
    the embedding) and the last (c blocks and the head), 0 <= a, c <= k (`chunk_layouts`; the
    layout flag states it,
    Megatron-LM's default even split a = k = c needs only --num-virtual-stages-per-pipeline-rank
    v), and the micro-batches a multiple of pp (Megatron);
  * the micro-batch size among `mbs_options` (the problem's own when none are given).

Exact for the evaluator: the 1F1B part is the NEST solver (nest.solver.search) on the space
restricted to one ZeRO stage and one recomputation mode, run once per pair, each seeded with the
best time found so far (its branch and bound stays exact: it discards only candidates whose lower
bound reaches a plan already found). Each interleaved plan is fixed by (variant, p, d, v,
placement, ZeRO, recomputation) and priced by the shared evaluator itself
(nest.costs.pipeline's interleaved form: interleaved_order, interleaved_peak_activations);
candidates are visited in order of a lower bound and the walk stops when the bound reaches the
best time: t_d sums the per-layer floors of device group d's chunks (nest.solver.bounds.floor_LR:
its compute plus the least collective any stage of the variant pays, no sends), the batch takes
at least max_j m t_j + sum_{d<j} t_d / v (`pipeline_floor`: group j's own work, after the first
micro-batch's forward reached it and before the last one's backward left it). Per placement,
`device_time_bounds` is priced only where its floor without sends
(nest.solver.interleaved_screen.placement_floors, which carries the data-parallel sync tail)
is below the best time; each plan's knobs are then walked in order of `device_time_bounds`.
Under pipeline_time critical_path / simulated (the simulated pipeline) these are floors of the
simulation's own per-operation times (nest.costs.pipeline.interleaved_floor), so the
interleaved walk stays exact there (and under overlap_p2p_comm, whose sends these floors price
as the evaluator does); the 1F1B part then optimises the paper's form, an upper
bound, and re-scores (nest.solver). Ties keep the first found: 1F1B before interleaved, fewer
chunks first, the smaller micro-batch first.
"""

from __future__ import annotations

import math

import numpy as np

from nest.costs.layers import layer_table
from nest.problem.placement import interleaves, runs_context_parallel
from nest.problem.problem import Problem, with_mbs
from nest.problem.space import SearchSpace, declare, pp_dp_options


def virtual_options(num_blocks: int, p: int, m: int, max_v: int | None = None,
                    overlap_p2p: bool = False) -> list[int]:
    """v >= 2 with p >= 2, m a multiple of p (Megatron-LM's interleaved schedule) and at least
    one chunk layout (`chunk_layouts`). Without overlap_p2p (the training setting
    overlap_p2p_comm) p >= 3 (nest.problem.placement.interleaves: Megatron-LM's validate_args)."""
    if not interleaves(p, overlap_p2p) or m % p:
        return []
    top = (num_blocks + 2) // p if max_v is None else min(max_v, (num_blocks + 2) // p)
    return [v for v in range(2, top + 1) if chunk_layouts(num_blocks, p, v)]


def chunk_layouts(num_blocks: int, p: int, v: int) -> list[tuple[int, int, int]]:
    """(a, k, c): the p v - 2 middle chunks hold k = ceil(blocks / (p v)) blocks each (the fewest
    that hold them), the first a (and the embedding) and the last c (and the head) the rest,
    0 <= a, c <= k; ordered by a. --pipeline-model-parallel-layout states any of them; the even
    split (Megatron-LM's default) is a = k = c. Layouts with a larger k (lighter ends) are
    launchable too but not searched: each one more k adds about k candidates per (p, v), most
    within a percent of each other, and the search evaluates them all (docs/planning.md)."""
    inner = p * v - 2
    k = -(-num_blocks // (p * v))
    rest = num_blocks - inner * k
    if k < 1 or rest < 0:
        return []
    return [(a, k, rest - a) for a in range(max(0, rest - k), min(k, rest) + 1)]


def layout_cuts(num_blocks: int, chunks: int, layout: tuple[int, int, int]
                ) -> list[tuple[int, int]]:
    """Layer-graph ranges [embedding, block_0 .. block_{n-1}, head] of the chunks of `layout`
    (`chunk_layouts`), in model order."""
    from nest.problem.plan_spec import sized_cuts

    a, k, c = layout
    assert chunks >= 2
    return sized_cuts([a, *[k] * (chunks - 2), c], num_blocks)


def interleaved_plan(problem: Problem, variant, p: int, d: int, v: int, placement: str,
                     zero: int, recompute: str, planner: str = "nest", layout=None):
    """The interleaved plan of these knobs; `layout` (a, k, c) of `chunk_layouts`, None:
    Megatron-LM's default even split."""
    from nest.problem.plan import Plan, Stage, place

    cuts = interleaved_cuts(problem, p, v, layout)
    ids = place(p, d, variant.width, placement, tp=variant.tp, cp=variant.cp, ep=variant.ep)
    stages = tuple(Stage(a, b, d * variant.width, ids[c % p], zero, recompute)
                   for c, (a, b) in enumerate(cuts))
    return Plan(planner=planner, model=problem.model_ref or problem.model.name,
                cluster=problem.cluster_ref or problem.cluster.name,
                num_devices=problem.num_devices, mbs=problem.mbs,
                global_batch=problem.training.global_batch,
                num_microbatches=problem.num_microbatches(d, variant.ep), tp=variant.tp, pp=p,
                dp=d, ep=variant.ep, cp=variant.cp, sp=variant.sp, stages=stages,
                placement=placement, schedule="interleaved", virtual_stages=v)


def interleaved_cuts(problem: Problem, p: int, v: int, layout=None) -> list[tuple[int, int]]:
    """The p v chunks' block ranges: `layout_cuts` of `layout`, None: Megatron-LM's even split
    (nest.problem.plan_spec.block_cuts). The plan and the memory screen both cut here."""
    from nest.problem.plan_spec import block_cuts

    num_blocks = problem.graph.num_layers - 2
    return list(block_cuts(num_blocks, p * v) if layout is None
                else layout_cuts(num_blocks, p * v, layout))


def interleaved_candidates(problem: Problem, space: SearchSpace, max_v: int | None = None,
                           below: float = math.inf):
    """(bound, order, variant, p, d, v, layout, bound_R) of every interleaved candidate, bound
    first: the floor bound of the module docstring (`pipeline_floor` of the chunks' floors)
    under the cheapest recomputation mode of the space; bound_R: that floor per mode of the
    space (nest.solver.interleaved_screen.live_knobs). below: only the candidates whose bound
    is below it, in the same order (`search_interleaved` stops at the first that is not); a
    (variant, p, d) is passed over whole when m sum_layers floor[:, r] / p, at most every
    layout's bound for mode r (m max_j t_j >= m mean_j t_j), reaches it for every r (with a
    relative 1e-9 for the rounding of the chunk sums)."""
    from nest.solver.bounds import floor_LR

    from nest.costs.memory import allocatable

    num_blocks = problem.graph.num_layers - 2
    cap = allocatable(problem.cluster.hardware) * (1 + 1e-9)
    out = []
    for vi, var in enumerate(space.variants):
        prefix_LR = None
        for p, d in pp_dp_options(problem, space, var):
            m = problem.num_microbatches(d, var.ep)
            vs = virtual_options(num_blocks, p, m, max_v, problem.training.overlap_p2p_comm)
            if not vs:
                continue
            if prefix_LR is None:
                lt = layer_table(problem, var, space.recompute_modes)
                floor_LR_ = floor_LR(problem, [lt], space)
                prefix_LR = np.concatenate([np.zeros((1, floor_LR_.shape[1])),
                                            np.cumsum(floor_LR_, axis=0)])
            if states_floor(problem, lt, space, d) / p > cap:
                continue  # no device group can hold its share of the model states, whatever v
            if m * float(prefix_LR[-1].min()) / p * (1 - 1e-9) >= below:
                continue  # every layout's bound reaches `below`
            for v in vs:
                for lay in chunk_layouts(num_blocks, p, v):
                    cuts = np.array(layout_cuts(num_blocks, p * v, lay))
                    chunk_CR = prefix_LR[cuts[:, 1] + 1] - prefix_LR[cuts[:, 0]]
                    bound = pipeline_floor(chunk_CR.reshape(v, p, -1).sum(axis=0), m, v)
                    if float(bound.min()) >= below:
                        continue
                    out.append((float(bound.min()), (vi, p, d, v, lay), var, p, d, v, lay,
                                bound))
    out.sort(key=lambda c: (c[0], c[1]))
    return out


def pipeline_floor(t_D, m: int, v: int, send_fwd=None, send_bwd=None,
                   overlap_p2p: bool = False):
    """A floor on an interleaved batch's pipeline time from each device group's time per
    micro-batch t_D (axis 0; floors of it are floors of this) and its sums of sends (none: 0,
    for floors of t_D without sends, as nest.solver.bounds.floor_LR's):
    nest.costs.pipeline.interleaved_floor, max_j m t_j + sum_{d<j} (chunk 0's share of t_d),
    from the per-operation times the simulation runs (<= the paper's form
    (m + (p - 1) / v) max_d t_d); overlap_p2p: with the sends' exposed part only (overlap_p2p_comm;
    a floor without sends is a floor of that too)."""
    from nest.costs.pipeline import interleaved_floor

    zero = np.zeros(len(t_D))
    return interleaved_floor(t_D, zero if send_fwd is None else send_fwd,
                             zero if send_bwd is None else send_bwd, m, v, overlap_p2p)


def states_floor(problem: Problem, lt, space: SearchSpace, d: int) -> float:
    """The whole model's weights, gradients and optimizer states per device under the space's
    most sharding ZeRO stage (nest.costs.memory.state_bytes): additive over layers, so some device
    group of p holds at least this / p of them, and nothing else it allocates is negative."""
    from nest.costs.memory import state_bytes

    L, v = lt.num_layers, lt.variant
    c = (L - 1, 0)
    return min(sum(state_bytes(lt.pd_LL[c], lt.pe_LL[c], d, v.ep, v.cp, z, problem.training,
                               lt.fp8_LL[c]).values()) for z in space.zero_stages)


def device_time_bounds(problem: Problem, space: SearchSpace, plan, from_grid: bool = True
                       ) -> np.ndarray:
    """Per (ZeRO stage, recomputation mode) of the space, a lower bound of the evaluator's time
    for `plan` with those knobs on every chunk: the stage kernel's time per micro-batch of each
    chunk (nest.costs.stage.stage_cost, with the links nest.costs.pipeline.links gives it, as the
    evaluator prices it), summed per device group; the batch takes at least `pipeline_floor` of
    them (with the groups' sums of sends, as the simulation runs them), and under the paper's
    form exactly (m + (p - 1) / v) max_d t_d (t_d its exposed-sends form under
    overlap_p2p_comm, nest.costs.pipeline.interleaved_busy) before the gradient sync's tail
    (nest.costs.pipeline); with dp_overlap "none" the tail is added as the evaluator
    prices it (max over device groups of their chunks' sync + optimizer step), with an
    overlapped sync a floor of it (device group 0's sync and step beyond one chunk's time).
    from_grid: the chunks' position-free terms read from the
    whole [b, a] grid, shared by every chunk, layout and placement whose group terms are equal
    (stage_cost's from_grid: the same values, bit for bit, as pricing each chunk's cell)."""
    from nest.costs.pipeline import chunks_of, links
    from nest.costs.stage import stage_cost

    p, v, m = plan.pp, plan.virtual_stages, plan.num_microbatches
    lt = layer_table(problem, plan.stage_variant(0), space.recompute_modes)
    ids = [s.device_ids for s in plan.stages]
    Z, R = len(space.zero_stages), len(space.recompute_modes)
    t, u, sends = [], [], []
    for c, st in enumerate(plan.stages):
        cost = stage_cost(problem, lt, st.device_ids, plan.dp, space.options, 0.0,
                          cell=(st.first_layer, st.last_layer), from_grid=from_grid,
                          **links(ids, c))
        t.append(np.asarray(cost.t).reshape(Z, R))
        u.append(np.broadcast_to(np.asarray(cost.u, dtype=float), (Z,)))
        sends.append((float(cost.send_fwd), float(cost.send_bwd)))
    groups = [chunks_of(g, p, len(t)) for g in range(p)]
    t_D = np.array([sum(t[c] for c in cs) for cs in groups])
    u_D = np.array([sum(u[c] for c in cs) for cs in groups])
    # the groups' sums of sends, as the evaluator sums them (nest.problem.evaluate)
    sf_D, sb_D = ([sum(sends[c][k] for c in cs) for cs in groups] for k in (0, 1))
    return batch_floor(problem, t_D, u_D, m, p, v, sf_D, sb_D)


def batch_floor(problem: Problem, t_D, u_D, m: int, p: int, v: int, send_fwd=None,
                send_bwd=None, overlapped_tail: bool = True) -> np.ndarray:
    """[Z, R] floor of an interleaved batch from its device groups' times per micro-batch t_D
    [p, Z, R] and their chunks' sync + optimizer step u_D [p, Z], sends summed per group (None:
    floors without sends): the pipeline under the paper's form exactly (m + (p - 1) / v)
    max_d t_d (nest.costs.pipeline), else `pipeline_floor`; then the gradient sync's tail.
    With dp_overlap "none", after the flush every device group syncs its chunks' gradients and
    steps: the evaluator's tail max_g sum_c (sync_c + step_c) (nest.costs.pipeline.tail_s), the
    same kernel's u (the same sums in another order: a relative slack of 1e-12 keeps the whole a
    floor when it is exact). Overlapped ("stage" / "bucketed"): device group 0 has nothing left
    to drain after its last backward, and the part of its sync that its last chunk's gradient
    window W_0 <= t_0 / v cannot hide, then its step and weight gather, stay exposed: tail >=
    u_0 - t_0 / v (nest.costs.pipeline.dp_sync_tail_s with dp_sync_exposed_s(S, W, k) >= S -
    W); overlapped_tail False takes 0 instead (for floors of t_D, which that term would not be
    a floor of). overlap_p2p_comm with sends given: the paper's form of the groups'
    nest.costs.pipeline.interleaved_busy (the evaluator's, exactly), or the floor with the
    sends' exposed part; a t_D without sends is at most every group's busy time, so the
    unchanged forms stay floors."""
    from nest.costs.pipeline import interleaved_busy, overlaps_p2p, paper_interleaved

    p2p = overlaps_p2p(problem.training, "interleaved", v) and send_fwd is not None
    if problem.training.pipeline_time == "paper":
        busy = interleaved_busy(t_D, send_fwd, send_bwd, m, v, True) if p2p else t_D
        pipe = paper_interleaved(busy.max(axis=0), m, p, v)
    else:
        pipe = pipeline_floor(t_D, m, v, send_fwd, send_bwd, p2p)
    if problem.training.dp_overlap == "none":
        tail = u_D.max(axis=0)[:, None]
    elif overlapped_tail:
        tail = np.maximum(0.0, u_D[0][:, None] - t_D[0] / v)
    else:
        tail = 0.0
    return (pipe + tail) * (1 - 1e-12)


def search_interleaved(problem: Problem, space: SearchSpace, best_T: float,
                       max_v: int | None = None):
    """(time, plan, evaluated) of the fastest feasible interleaved plan beating best_T, or
    (best_T, None, evaluated)."""
    from dataclasses import replace

    from nest.problem.evaluate import evaluate
    from nest.solver.interleaved_screen import fits, live_knobs, placement_floors

    best, n = None, 0
    for bound, _, var, p, d, v, lay, bound_R in interleaved_candidates(problem, space, max_v,
                                                                       best_T):
        if bound >= best_T:
            break
        cuts = interleaved_cuts(problem, p, v, lay)
        fit = fits(problem, var, p, d, v, live_knobs(space, bound_R, best_T), cuts)
        knobs = [k for k in fit.knobs if not fit.out_at_floor0(*k)]  # the cheap memory test
        if not knobs:
            continue
        floors = placement_floors(problem, space, var, p, d, v, cuts)
        placements = [pl for pl, f in floors if float(f.min()) < best_T]
        if not placements:  # device_time_bounds is at least the floor: no knob is priced
            continue
        # a knob whose floor reaches best_T on every placement is never priced: not screened
        low = np.min([f for _, f in floors], axis=0) < best_T
        fit.knobs = [(z, r) for z, r in knobs
                     if low[space.zero_stages.index(z), space.recompute_modes.index(r)]]
        if not fit.any():  # no knob both may beat best_T and fits, whatever the placement
            continue
        for placement in placements:
            plan = interleaved_plan(problem, var, p, d, v, placement, space.zero_stages[0],
                                    space.recompute_modes[0], layout=lay)
            lb = device_time_bounds(problem, space, plan)
            for zi, ri in sorted(np.ndindex(*lb.shape), key=lambda k: (lb[k], k)):
                if lb[zi, ri] >= best_T:
                    break
                z, r = space.zero_stages[zi], space.recompute_modes[ri]
                if not fit.get((z, r)):
                    continue
                q = plan.with_(stages=tuple(replace(s, zero_stage=z, recompute=r)
                                            for s in plan.stages))
                ev = evaluate(q, problem)
                n += 1
                if ev.feasible and ev.time_per_batch_s < best_T:
                    best_T, best = ev.time_per_batch_s, q
    return best_T, best, n


def launchable_space(space: SearchSpace, problem: Problem | None = None) -> SearchSpace:
    """The space without the variants with cp > 1 and ep > 1: Megatron-LM builds its expert
    groups on a grid that folds ep over the cp ranks, so no launch runs the groups such a plan
    prices (nest.interfaces.export projects it). Priced with the unfused attention core
    (nest.graph.attention; A100 / V100 hardware files), without cp > 1 either
    (nest.problem.placement.runs_context_parallel). With a problem, only the placements Megatron-LM's CLI launches as
    priced on its cluster's nodes (SearchSpace.launch_node; e.g. not tp-cp-ep-pp-dp with ep > 1,
    pp > 1 and a stage's tp x ep below a node: no CLI order builds those groups and torchrun's
    one block of ranks per node cannot pin them, so the export would re-order the plan)."""
    no_cp = problem is not None and not runs_context_parallel(problem.attention)
    return space.with_(variants=tuple(v for v in space.variants
                                      if v.launchable and not (no_cp and v.cp > 1)),
                       launch_node=problem.cluster.node_size if problem is not None else 0)


def search_launchable(problem: Problem, settings: dict, log=None):
    """(time, plan, stats, problem of the plan's micro-batch size) of the launchable optimum
    (module docstring); plan None if nothing fits."""
    from nest.problem.evaluate import evaluate
    from nest.solver import mbs_sizes, plan_of, search

    best_T, best, best_pr = math.inf, None, problem
    stats = {"candidates": 0, "visited": 0, "interleaved": 0, "tied": []}
    interleave = settings.get("interleaved", True)
    for mbs in mbs_sizes(problem, settings):
        pr = with_mbs(problem, mbs)
        base = launchable_space(declare(pr, {**(settings.get("space") or {}),
                                             "heterogeneous_stages": False}), pr)
        for z in base.zero_stages:
            for r in base.recompute_modes:
                space = base.with_(zero_stages=(z,), recompute_modes=(r,))
                T, found, st = search(pr, space, incumbent=best_T,
                                      union=base if settings.get("union_bound", True) else None)
                stats["candidates"] += st["candidates"]
                stats["visited"] += st["visited"]
                if found is None:
                    continue
                plan = plan_of(pr, space, "nest", found)
                ev = evaluate(plan, pr)  # the evaluator's time, whatever the form optimised
                if ev.feasible and ev.time_per_batch_s < best_T:
                    best_T, best, best_pr = ev.time_per_batch_s, plan, pr
                    stats["tied"], stats["tied_space"] = st["tied"], space
                    if log:
                        log(f"  1f1b mbs={mbs} zero={z} recompute={r}: {best_T:.6g} s")
        if interleave:
            T, found, n = search_interleaved(pr, base, best_T, settings.get("max_virtual_stages"))
            stats["interleaved"] += n
            if found is not None:
                best_T, best, best_pr = T, found, pr
                stats["tied"] = []
    return best_T, best, stats, best_pr


def differs(plan) -> dict:
    """What of a plan Megatron-LM cannot launch as priced: {'variants' | 'zero' | 'recompute':
    sorted distinct values} for the knobs that differ between stages."""
    out = {}
    keys = {plan.stage_variant(j).key for j in range(len(plan.stages))}
    if len(keys) > 1:
        out["variants"] = sorted(keys)
    for name, attr in (("zero", "zero_stage"), ("recompute", "recompute")):
        vals = {getattr(s, attr) for s in plan.stages}
        if len(vals) > 1:
            out[name] = sorted(vals)
    return out
