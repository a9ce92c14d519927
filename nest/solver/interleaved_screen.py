"""Interleaved candidate x (ZeRO, recomputation) -> may it beat the best time, and does it fit?

An interleaved plan of the launchable space (nest.solver.launchable) is fixed by (variant, p, d,
v, placement, ZeRO stage z, recomputation mode r). Before its time is priced per placement
(nest.solver.launchable.device_time_bounds, then the evaluator), two placement-free screens drop
knobs that cannot win, exactly:

* time: the candidate's floor bound (launchable's module docstring: `pipeline_floor` of its
  chunks' per-layer floors) taken for mode r alone instead of the cheapest mode: a knob whose
  bound reaches the best time found cannot beat it;
* memory: a plan's memory does not depend on the placement. Every chunk's record
  (nest.costs.stage.stage_memory: ZeRO-sharded states, its stash of activations, the working
  set) reads only the layer table, d, z, r and the chunk's stash, and a device group's total
  (nest.problem.evaluate.device_memory) only its chunks' records. So one pass per (variant, p,
  d, v) tells, for every (z, r), whether the evaluator would find the plan out of memory on some
  device group, with the evaluator's own functions on the same inputs: the same bytes, bit for
  bit (nest.costs.stage.stage_memories: a device group's chunks at once). A plan out of memory is infeasible: skipping it changes nothing the search returns.

Nearly every knob screened is out of memory on device group 0 (the longest warm-up, the
embedding), so before that exact pass a knob is tried on group 0's floor (`Fits.floor0`): the
same parts from the same functions (nest.costs.memory.state_bytes, working_bytes, peak;
nest.costs.pipeline.interleaved_peak_activations), each chunk's activations read from the
layer table instead of through its stash (x held / held), summed in another order; its state
parts per ZeRO stage and its activations per mode are kept for the candidate's other knobs.
It differs from the exact total by rounding alone (a few ulps), so a knob whose floor exceeds
HBM by a relative 1e-9 is out of memory; any other goes through the exact pass.
"""

from __future__ import annotations


import numpy as np

from nest.costs.cache import read_only
from nest.costs.layers import ALL_MODES, layer_table
from nest.costs.memory import allocated, peak, resident_and_step, state_bytes, working_bytes
from nest.costs.pipeline import chunks_of, device_group, interleaved_peak_activations, stash
from nest.costs.stage import stage_memories
from nest.problem.evaluate import device_memory
from nest.problem.plan_spec import block_cuts
from nest.problem.problem import Problem
from nest.problem.space import SearchSpace

MODES = ALL_MODES  # the evaluator's layer table (nest.problem.evaluate._stage)
MARGIN = 1e-9  # relative: far above the rounding between `Fits.floor0` and the exact total


def live_knobs(space: SearchSpace, bound_R, best_T: float) -> list[tuple[int, str]]:
    """(z, r) of the space whose floor bound for mode r (bound_R, per mode of the space:
    nest.solver.launchable.interleaved_candidates) is below best_T. It was m sum_layers
    floor[:, r] / p, at most the pipeline floor (m max_j t_j >= m mean_j t_j): the same knobs
    or fewer, each dropped one bounded below by best_T."""
    return [(z, r) for z in space.zero_stages for ri, r in enumerate(space.recompute_modes)
            if float(bound_R[ri]) < best_T]


class Fits:
    """fits[z, r]: the interleaved plan of these knobs fits in every device group's HBM, as the
    evaluator decides it (a peak above hbm_bytes is out of memory); worked out on first asking,
    device group by device group, stopping at the first that does not fit. `any()`: some knob
    of `knobs` fits (asking them in order until one does)."""

    def __init__(self, problem: Problem, var, p: int, d: int, v: int, knobs, cuts=None):
        self.problem, self.var, self.p, self.d, self.knobs = problem, var, p, d, list(knobs)
        self.m = problem.num_microbatches(d, var.ep)
        self.cuts = (block_cuts(problem.graph.num_layers - 2, p * v) if cuts is None
                     else list(cuts))
        self.held = [stash(p, device_group(j, p), self.m, "interleaved", v)
                     for j in range(len(self.cuts))]
        self.lt = layer_table(problem, var, MODES)
        # what does not depend on the knobs asked, kept in the problem's cache by (var, p, d,
        # v, cuts), all it reads: the searches per micro-batch size's spaces, and the search on
        # all devices (nest.interfaces.cli_run), share it. Values of pure functions of the key,
        # each written once: a later reader gets the floats it would compute.
        memo = problem.cache.get("interleaved_fits", (var, p, d, v, tuple(map(tuple, self.cuts))),
                                 lambda: ({}, {}, {}, {}))
        self._known, self._states0, self._act0, self._floor0 = memo
        # _known: (z, r) -> `_fits`; _states0: z -> group 0's (resident, step) state bytes over
        # its chunks; _act0: r -> group 0's peak activations; _floor0: (z, r) -> `floor0`

    def floor0(self, z: int, r: str) -> float:
        """Device group 0's peak bytes under (z, r) up to rounding (module docstring)."""
        if (z, r) not in self._floor0:
            self._floor0[z, r] = self._floor0_of(z, r)
        return self._floor0[z, r]

    def _floor0_of(self, z: int, r: str) -> float:
        lt, tr, p = self.lt, self.problem.training, self.p
        ks = list(chunks_of(0, p, len(self.cuts)))
        a = np.array([self.cuts[k][0] for k in ks])
        b = np.array([self.cuts[k][1] for k in ks])
        ri = lt.modes.index(r)
        if z not in self._states0:
            v = lt.variant
            parts = state_bytes(lt.pd_LL[b, a], lt.pe_LL[b, a], self.d, v.ep, v.cp, z, tr,
                                lt.fp8_LL[b, a])
            self._states0[z] = resident_and_step({k: float(np.sum(x)) for k, x in parts.items()})
        if r not in self._act0:
            self._act0[r] = interleaved_peak_activations(lt.act_LLR[b, a, ri], p, self.m, 0)
        work = float(np.max(working_bytes(lt.work_LLR[b, a, ri], lt.maxpar_LL[b, a], z, tr)))
        resident, step = self._states0[z]
        return peak(allocated(resident + self._act0[r] + work, step), self.problem.cluster.hardware)

    def out_at_floor0(self, z: int, r: str) -> bool:
        """The knob is out of memory by device group 0's floor (the first test of `_fits`)."""
        return self.floor0(z, r) > self.problem.cluster.hardware.hbm_bytes * (1 + MARGIN)

    def __getitem__(self, knob) -> bool:
        if knob not in self.knobs:
            return False
        if knob not in self._known:
            self._known[knob] = self._fits(*knob)
        return self._known[knob]

    def get(self, knob) -> bool:
        return self[knob]

    def any(self) -> bool:
        return any(self[k] for k in self.knobs)

    def _fits(self, z: int, r: str) -> bool:
        pr, p, n = self.problem, self.p, len(self.cuts)
        hw = pr.cluster.hardware
        if self.out_at_floor0(z, r):
            return False
        for g in range(p):
            ks = list(chunks_of(g, p, n))
            mems = stage_memories(pr, self.lt, self.d, z, r, [self.held[k] for k in ks],
                                  [self.cuts[k][0] for k in ks], [self.cuts[k][1] for k in ks])
            if sum(device_memory(mems, p, self.m, g, self.held[g], hw).values()) > hw.hbm_bytes:
                return False
        return True


def fits(problem: Problem, var, p: int, d: int, v: int, knobs, cuts=None) -> Fits:
    """The memory screen of the interleaved candidate (var, p, d, v) over `knobs` (`Fits`), its
    p v chunks cut at `cuts` (nest.solver.launchable.interleaved_cuts; None: Megatron-LM's even
    split): a chunk's stash and records read its own block range."""
    return Fits(problem, var, p, d, v, knobs, cuts)


def placement_floors(problem: Problem, space: SearchSpace, var, p: int, d: int, v: int, cuts
                     ) -> list[tuple[str, np.ndarray]]:
    """(placement, floor_ZR) for each placement of the space: per (ZeRO stage, recomputation
    mode) of the space, nest.solver.launchable.device_time_bounds of the interleaved plan with
    those chunk cuts, less its pipeline sends and tied-embedding all-reduce. Every chunk's
    other terms are that bound's own (the stage kernel's position-free terms, read from the
    whole grid of the device group's group terms, nest.costs.stage.grid_terms, as its
    from_grid reads them), summed and combined in the same order; the terms left out are >= 0
    and every operation is monotone, so floor_ZR <= device_time_bounds, float for float. It
    costs a grid gather per device group (its group terms kept per (p, d, placement), shared by
    every v and layout) instead of a stage kernel (and its sends) per chunk, so the search
    prices device_time_bounds only where this floor is below its best time
    (tests/test_placement_floors.py); both combine their terms in `batch_floor`. Kept in the
    problem's cache (the searches of the micro-batch size, and on all devices, share it)."""
    key = (var, space.recompute_modes, space.zero_stages, space.placements, space.launch_node,
           p, d, v, tuple(map(tuple, cuts)))  # all it reads of the space and the candidate
    return problem.cache.get("placement_floors", key, lambda: read_only(
        _placement_floors(problem, space, var, p, d, v, cuts)))


def _placement_floors(problem: Problem, space: SearchSpace, var, p: int, d: int, v: int, cuts
                      ) -> list[tuple[str, np.ndarray]]:
    from nest.costs.groups import group_terms
    from nest.costs.stage import grid_terms
    from nest.problem.plan import place
    from nest.solver.launchable import batch_floor

    m = problem.num_microbatches(d, var.ep)
    lt = layer_table(problem, var, space.recompute_modes)
    first = np.array([a for a, _ in cuts])
    last = np.array([b for _, b in cuts])
    groups = [list(chunks_of(g, p, len(cuts))) for g in range(p)]
    out = []
    for placement in space.placements_for(var, p, d):
        gts = problem.cache.get(lt.store, ("device_groups", p, d, placement),
                                lambda placement=placement: tuple(
                                    group_terms(problem, lt, i, d)
                                    for i in place(p, d, var.width, placement, tp=var.tp,
                                                   cp=var.cp, ep=var.ep)))
        t_D, u_D = [], []
        for g, cs in enumerate(groups):
            base_R, per_mb_Z, sync_Z = grid_terms(problem, lt, gts[g], d, space.options)[:3]
            t_D.append(sum(base_R[last[c], first[c]][None, :]
                           + per_mb_Z[last[c], first[c]][:, None] for c in cs))
            u_D.append(sum(sync_Z[last[c], first[c]] for c in cs))
        # the sync tail after the flush (its tied all-reduce left out); overlapped: 0 <= it
        out.append((placement, batch_floor(problem, np.array(t_D), np.array(u_D), m, p, v,
                                           overlapped_tail=False)))
    return out
