"""Interleaved candidate x (ZeRO, recomputation) -> may it beat the best time, and does it fit?

An interleaved plan of the launchable space (nest.solver.launchable) is fixed by (variant, p, d,
v, placement, ZeRO stage z, recomputation mode r). Before its time is priced per placement
(nest.solver.launchable.device_time_bounds, then the evaluator), two placement-free screens drop
knobs that cannot win, exactly:

* time: the candidate's floor bound (launchable's module docstring, m sum_layers floor / p) taken
  for mode r alone instead of the cheapest mode: a knob whose bound reaches the best time found
  cannot beat it;
* memory: a plan's memory does not depend on the placement. Every chunk's record
  (nest.costs.stage.stage_memory: ZeRO-sharded states, its stash of activations, the working
  set) reads only the layer table, d, z, r and the chunk's stash, and a device group's total
  (nest.problem.evaluate.device_memory) only its chunks' records. So one pass per (variant, p,
  d, v) tells, for every (z, r), whether the evaluator would find the plan out of memory on some
  device group, with the evaluator's own functions on the same inputs: the same bytes, bit for
  bit. A plan out of memory is infeasible: skipping it changes nothing the search returns.
"""

from __future__ import annotations

import numpy as np

from nest.costs.layers import layer_table
from nest.costs.pipeline import chunks_of, device_group, stash
from nest.costs.stage import stage_memory
from nest.problem.evaluate import device_memory
from nest.problem.plan_spec import block_cuts
from nest.problem.problem import Problem
from nest.problem.space import SearchSpace

MODES = ("none", "selective", "full")  # the evaluator's layer table (nest.problem.evaluate._stage)


def live_knobs(problem: Problem, space: SearchSpace, var, p: int, d: int, best_T: float
               ) -> list[tuple[int, str]]:
    """(z, r) of the space whose floor bound m sum_layers floor[:, r] / p is below best_T."""
    from nest.solver.bounds import floor_LR

    m = problem.num_microbatches(d, var.ep)
    lt = layer_table(problem, var, space.recompute_modes)
    floor_R = floor_LR(problem, [lt], space).sum(axis=0)
    return [(z, r) for z in space.zero_stages for ri, r in enumerate(space.recompute_modes)
            if m * float(floor_R[ri]) / p < best_T]


def fits(problem: Problem, var, p: int, d: int, v: int, knobs) -> dict:
    """{(z, r): the interleaved plan of these knobs fits in every device group's HBM} for the
    knobs given, as the evaluator decides it (a peak above hbm_bytes is out of memory)."""
    num_blocks = problem.graph.num_layers - 2
    m = problem.num_microbatches(d, var.ep)
    cuts = block_cuts(num_blocks, p * v)
    n, hw = len(cuts), problem.cluster.hardware
    lt = layer_table(problem, var, MODES)
    held = [stash(p, device_group(j, p), m, "interleaved", v) for j in range(n)]
    out = {}
    for z, r in knobs:
        mems = [stage_memory(problem, lt, d, z, r, np.asarray(held[j], dtype=float), a, b)
                for j, (a, b) in enumerate(cuts)]
        out[z, r] = all(
            sum(device_memory([mems[k] for k in chunks_of(g, p, n)], p, m, g, held[g],
                              hw).values()) <= hw.hbm_bytes for g in range(p))
    return out
