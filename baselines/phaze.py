"""Phaze baseline: a network-blind DP over pipeline stages, data parallelism and tensor/expert
templates, solved on a flat network and scored on the real one.

Follows Wang, Tarnawski, Phanishayee & Mahajan 2024, "Integrated Hardware Architecture and Device
Placement Search" (ICML), its device-placement search (the dynamic program it builds on Piper,
Tarnawski et al. 2021), as the NEST paper uses it: NEST section 5.1 ("we evaluate only its device
placement component", same PipeDream-Flush schedule and shared cost model), section 5.2.1
("Phaze's DP assumes a flat, uniform network ... it balances computation, it overlooks
communication costs") and section 5.3 (its plans on the oversubscribed spine-leaf).

Phaze's recurrence. For a fixed template width t, a data-parallel degree d and a pipeline of p
stages over contiguous layer ranges, Phaze minimises
    T = the paper's 1F1B form over max_j load_j + (data-parallel resync),  m = ceil(mb / d),
where load_j (forward + backward [+ recomputed forward] + boundary transfers of stage j) and every
collective are priced with ONE bandwidth, and a stage is admitted only if its weights, optimizer
state and its stash (nest.costs.pipeline.stash) fit in HBM. The inner part is the bottleneck DP
    f[j, b] = min_{a <= b} max(f[j-1, a-1], load_j(a..b))
which is exactly nest.solver.dp.bottleneck (NEST's solver wraps it in an epsilon-constraint loop
that makes the "+ tail" term exact, and a branch and bound over (t, d, p)); with stage devices fixed by (t, d, p) Phaze's device
dimension (k devices for the first stages) collapses to j * d * t. So Phaze's DP is NEST's DP on a
restricted space over a flattened network, and this module runs nest.solver.search on
    * the problem with its cluster replaced by nest.network.collectives.flattened(cluster): every
      level gets the innermost level's bandwidth and latency, no oversubscription (setting
      flat_bandwidth_GBps picks another single bandwidth);
    * the space: variants without SP or CP (tp widths and, as NEST's runs do for Mixtral, ep
      templates), ZeRO stage 0 only, recomputation none or full per stage, one fixed placement.
The plan it finds is mapped onto device ids with the fixed placement and handed to the shared
evaluator, which scores it on the real network. Its `predicted_time_per_batch_s` is Phaze's own
flat-network prediction, so prediction versus evaluation shows what network blindness costs.

What Phaze lacks relative to NEST (the space is a strict subset of nest.problem.space's, so Phaze can
never beat NEST under the shared evaluator):
    * network awareness: one bandwidth, no hierarchy, no oversubscription;
    * placement choice: stages and replicas are laid out in Megatron-LM's default rank order
      (tp fastest, then dp, then pp: `replica_major`), the order its Megatron fork launches with;
      NEST also searches `stage_major`;
    * ZeRO (no optimizer/gradient/parameter sharding);
    * selective recomputation (Phaze chooses between recomputing and stashing activations);
    * sequence and context parallelism (NEST section 5.2.1: "an expanded search space that
      includes SP and CP").

Deliberate deviations from the Phaze paper (details of its DP beyond the paper's text were read,
as facts only, from its published solver):
    1. Accelerator-architecture search and the per-layer operator-scheduling ILP are left out
       (the NEST paper compares only the placement component); per-layer times come from the
       shared cost table, as for every planner.
    2. Phaze's recomputation is one switch per solve (every stage but the last recomputes); here
       each stage chooses none or full. This contains both of Phaze's settings, so it errs in
       Phaze's favour (the last stage, too, may recompute when only that fits).
    3. The objective is the shared evaluator's time per batch under the training settings
       (pipeline_time, dp_overlap: nest.costs.pipeline, as NEST's solver optimises it), priced on
       the flat network: by default the paper's form above with the tail max_j (gradient sync_j
       + optimizer step_j) instead of Phaze's resync of the first stage's parameters only
       (4 (d-1)/d * params / bandwidth).
    4. The layer graph is a chain (embedding, blocks, head), so Phaze's downsets of a DAG are
       prefixes of the chain. Every stage runs on t devices per replica; Phaze may give a stage
       without a tensor-parallel layer a single device and leave the rest idle, which the shared
       plan contract (uniform dp * tp * ep * cp per stage) cannot express.
    5. Expert-parallel templates (ep) are searched, as the NEST paper's Table 2 shows for Phaze on
       Mixtral (e = 4); the original Phaze has no MoE models.
    6. The flat network keeps the cluster's switch sizes, so a collective whose group spans
       several nodes may still use the hierarchical algorithm; at one bandwidth that only saves
       per-step latency (same bytes: 2 (n-1)/n S / bw either way).

Speed: no time cap is needed; the slowest Figure 5 solve takes 4-10 s on 2 cores (BERT-large at
1024 devices; benchmarks/bench_phaze.py), most take under 2 s.
"""

from __future__ import annotations

import time

import numpy as np

from nest.common.errors import SpecError
from nest.costs.memory import peak, resident_and_step, state_bytes
from nest.costs.pipeline import held_bytes, stash
from nest.costs.layers import layer_table
from nest.costs.stage import Options, fixed_and_step_bytes
from nest.problem.problem import Problem
from nest.network.collectives import flattened
from nest.problem.plan import PLACEMENTS
from nest.solver import plan_of, search
from nest.problem.space import SearchSpace

DEFAULTS = {
    "recompute_modes": ["none", "full"],  # Phaze: recompute or stash activations
    "placement": "replica_major",         # Megatron-LM default rank order
    "flat_bandwidth_GBps": None,          # None: the innermost level's bandwidth (flattened())
    "expert_parallel": True,              # ep templates for MoE models (NEST's Phaze runs)
    "max_pp": None,                       # cap on pipeline stages (None: one layer per stage)
}
WHERE = "config/planners.yaml: key 'phaze.settings"


def _settings(settings: dict) -> dict:
    from nest.planners.registry import merged_settings

    s = merged_settings("phaze", settings, DEFAULTS)
    modes = s["recompute_modes"]
    if not modes or any(r not in ("none", "full") for r in modes):
        raise SpecError(f"{WHERE}.recompute_modes': {modes}; Phaze recomputes or stashes: a "
                        f"non-empty subset of [none, full]")
    if s["placement"] not in PLACEMENTS:
        raise SpecError(f"{WHERE}.placement': {s['placement']}, expected one of {PLACEMENTS}")
    bw = s["flat_bandwidth_GBps"]
    if bw is not None and not (isinstance(bw, (int, float)) and bw > 0):
        raise SpecError(f"{WHERE}.flat_bandwidth_GBps': {bw}, expected a positive number or null")
    if s["max_pp"] is not None and not (isinstance(s["max_pp"], int) and s["max_pp"] >= 1):
        raise SpecError(f"{WHERE}.max_pp': {s['max_pp']}, expected a positive integer or null")
    return s


def phaze_space(problem: Problem, settings: dict | None = None) -> SearchSpace:
    """Phaze's plan space as a restriction of nest.problem.space's (see the module docstring)."""
    s = _settings(settings or {})
    variants = tuple(v for v in problem.graph.variants
                     if not v.sp and v.cp == 1 and (s["expert_parallel"] or v.ep == 1))
    return SearchSpace(variants=variants, zero_stages=(0,),
                       recompute_modes=tuple(dict.fromkeys(s["recompute_modes"])),
                       placements=(s["placement"],), max_pp=s["max_pp"])


def network_blind(problem: Problem, flat_bandwidth_GBps: float | None = None) -> Problem:
    """The same problem on Phaze's view of the network: one bandwidth, no hierarchy effects.
    Compute costs, memory and the layer graph are shared with the real problem."""
    bw = None if flat_bandwidth_GBps is None else flat_bandwidth_GBps * 1e9
    return problem.with_cluster(flattened(problem.cluster, bw))


def plan(problem: Problem, settings: dict):
    from nest.planners.registry import NoPlan

    s = _settings(settings)
    space = phaze_space(problem, s)
    if not space.variants:
        raise NoPlan(f"{problem.model.name} has no sub-graph variant without sequence or context "
                     f"parallelism (Phaze's templates): {[v.key for v in problem.graph.variants]}")
    blind = network_blind(problem, s["flat_bandwidth_GBps"])
    t0 = time.perf_counter()
    flat_T, best, stats = search(blind, space)
    if best is None:
        raise NoPlan(_infeasibility_reason(problem, space))
    out = plan_of(problem, space, "phaze", best)
    bw = blind.cluster.levels[0].bytes_per_s
    return out.with_(predicted_time_per_batch_s=flat_T, solve_time_s=time.perf_counter() - t0,
                     notes=f"flat-network prediction {flat_T:.6g} s at one bandwidth of "
                           f"{bw / 1e9:g} GB/s; visited {stats['visited']} of "
                           f"{stats['candidates']} (variant, p, d) candidates",
                     extra={"flat_bandwidth_bytes_per_s": bw})


def _infeasibility_reason(problem: Problem, space: SearchSpace) -> str:
    """The layer that fits nowhere in Phaze's space and the least memory it needs: alone on the
    last stage (one micro-batch stashed), no ZeRO, the cheapest recomputation mode and variant
    (the evaluator's memory formula)."""
    hw, tr = problem.cluster.hardware, problem.training
    last_stash = stash(2, 1, 1)  # the last stage of any 1F1B pipeline: one micro-batch
    need = None
    for v in space.variants:
        if v.width > problem.num_devices:
            continue
        la = layer_table(problem, v, space.recompute_modes)
        i = np.arange(la.num_layers)
        alloc, step = fixed_and_step_bytes(problem, la, 1, Options((0,), la.modes), (i, i))
        mem = peak(held_bytes(alloc[:, 0, :], last_stash, la.act_LLR[i, i], step[:, 0, :]),
                   hw).min(axis=1)
        need = mem if need is None else np.minimum(need, mem)
    if need is None:
        return (f"every Phaze variant ({[v.key for v in space.variants]}) needs more than the "
                f"{problem.num_devices} devices")
    i = int(np.argmax(need))
    if need[i] <= hw.hbm_bytes:
        states = resident_and_step(state_bytes(la.dense_L.sum(), la.expert_L.sum(), 1, 1, 1,
                                               0, tr))[0]
        return (f"no plan of Phaze's space (no ZeRO, recomputation "
                f"{list(space.recompute_modes)}) fits in {hw.hbm_bytes / 1e9:.2f} GB per device: "
                f"every layer fits alone, but one copy of the weights, gradients and optimizer "
                f"states takes {states / 1e9:.2f} GB (variant {v.key}), more than "
                f"{problem.num_devices // v.width} stages can hold with stashed activations")
    return (f"no plan of Phaze's space (no ZeRO, recomputation {list(space.recompute_modes)}, "
            f"variants {[v.key for v in space.variants]}) fits in {hw.hbm_bytes / 1e9:.2f} GB "
            f"per device: layer {i} ({problem.graph.layers[i].name}) alone needs at least "
            f"{need[i] / 1e9:.2f} GB")
