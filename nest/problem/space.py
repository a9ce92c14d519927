"""Problem -> the plan search space, declared once for every planner that searches it.

A plan of the space is chosen by:
  * the sub-graph variant (tp, sp, ep, cp), shared by all stages (one of the model's variants);
  * the number of pipeline stages p and the data-parallel degree d, with p * d * tp*ep*cp <= N
    (remaining devices stay idle) and mbs * d * ep dividing global_batch (every plan processes
    exactly the global batch, as Megatron-LM requires: `splits_batch`);
    micro-batches m = global_batch / (mbs * d * ep);
  * contiguous cuts of the layer graph (embedding, blocks, head) into p non-empty stages;
  * per stage, a ZeRO stage and a recomputation mode;
  * a placement of stages and replicas on the hierarchy (nest.problem.plan.place).
`exhaustive` enumerates it plan by plan; the NEST solver searches it exactly.
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache
from collections.abc import Iterator
from dataclasses import dataclass, replace

from nest.costs.stage import Options
from nest.graph.layer_graph import Variant
from nest.problem.plan import Plan, stages_from_cuts
from nest.problem.problem import Problem
from nest.spec.catalog import config_dir, read_yaml, validate


@dataclass(frozen=True)
class SearchSpace:
    variants: tuple[Variant, ...]
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    recompute_modes: tuple[str, ...] = ("none", "selective", "full")
    placements: tuple[str, ...] = ("replica_major", "stage_major")
    max_pp: int | None = None
    heterogeneous: bool = False  # stages may each pick a variant of the candidate's class
    min_devices: int = 0  # plans use at least this many devices (p * d * width)
    launch_node: int = 0  # > 0: only placements Megatron-LM's CLI launches as priced on nodes
    # of this many devices (nest.problem.placement.launches_as_priced; nest plan's default space)

    @property
    def classes(self) -> tuple[tuple[Variant, ...], ...]:
        """Stage classes: variants that can share one pipeline's (p, d, placement) grid, i.e. the
        same width tp*ep*cp and the same ep (so every stage has dp*tp*ep*cp devices and runs the
        same dp*ep micro-batch streams). Homogeneous spaces: one variant per class."""
        if not self.heterogeneous:
            return tuple((v,) for v in self.variants)
        out: dict = {}
        for v in self.variants:
            out.setdefault((v.width, v.ep), []).append(v)
        return tuple(tuple(vs) for vs in out.values())

    def placements_for(self, v: Variant, p: int, d: int) -> tuple[str, ...]:
        """The placements of a candidate: the space's, with "orders" expanded to every rank order
        a launcher can express for these degrees (nest.problem.placement.launcher_orders), duplicates of
        the same device layout dropped; with launch_node, only those Megatron-LM's CLI launches as
        priced on nodes of that size (the export's own test, launches_as_priced)."""
        return _placements_for(self.placements, v.tp, v.cp, v.ep, p, d, self.launch_node)

    @property
    def options(self) -> Options:
        """The per-stage knobs, encoded o = z_index * R + r_index (nest.costs.stage.Options)."""
        return Options(self.zero_stages, self.recompute_modes)

    def with_(self, **kw) -> "SearchSpace":
        return replace(self, **kw)


@lru_cache(maxsize=65536)
def _placements_for(placements: tuple[str, ...], tp: int, cp: int, ep: int, p: int,
                    d: int, launch_node: int = 0) -> tuple[str, ...]:
    from nest.problem.placement import (canonical_order, launcher_orders, launches_as_priced,
                                        stage_id_array)

    out: dict = {}
    for pl in placements:
        for name in (launcher_orders(tp, cp, ep, d, p) if pl == "orders" else (pl,)):
            if launch_node and not launches_as_priced(tp, cp, ep, d, p, name, launch_node):
                continue
            key = stage_id_array(p, d, tp, cp, ep, canonical_order(name)).tobytes()
            out.setdefault(key, name)
    return tuple(out.values())


def declare(problem: Problem, overrides: dict | None = None) -> SearchSpace:
    path = config_dir() / "search_space.yaml"
    d = read_yaml(path)
    d.update(overrides or {})
    validate(d, "search_space", f"{path} (+ planner overrides)")
    keep = {k: d[k] for k in ("tp", "sp", "ep", "cp") if d.get(k) is not None}
    variants = tuple(v for v in problem.graph.variants
                     if all(getattr(v, k) in allowed for k, allowed in keep.items()))
    return SearchSpace(
        variants=variants,
        zero_stages=tuple(d.get("zero_stages", (0, 1, 2, 3))),
        recompute_modes=tuple(d.get("recompute_modes", ("none", "selective", "full"))),
        placements=tuple(d.get("placements", ("replica_major", "stage_major"))),
        max_pp=d.get("max_pp"),
        heterogeneous=bool(d.get("heterogeneous_stages", False)),
        min_devices=int(d.get("min_devices") or 0),
    )


def splits_batch(problem: Problem, d: int, ep: int) -> bool:
    """Whether d * ep data-parallel streams of mbs samples split the global batch exactly into
    whole micro-batches (global_batch = mbs * d * ep * m): otherwise a plan would process more
    samples than the batch it reports (Megatron-LM refuses such a configuration)."""
    return problem.training.global_batch % (problem.mbs * d * ep) == 0


def pp_dp_options(problem: Problem, space: SearchSpace, v: Variant) -> Iterator[tuple[int, int]]:
    """(p, d) with p <= layers, p * d * width <= N and mbs * d * ep dividing the global batch
    (`splits_batch`: every data-parallel rank gets whole micro-batches and the plan processes
    exactly the global batch), p * d * width >= the space's min_devices."""
    n_layers = problem.graph.num_layers
    top = min(n_layers, space.max_pp or n_layers, problem.num_devices // v.width)
    d_batch = problem.training.global_batch // (problem.mbs * v.ep)
    splits = [d for d in range(1, min(problem.num_devices // v.width, d_batch) + 1)
              if splits_batch(problem, d, v.ep)]  # ascending: the d of any p are a prefix
    for p in range(1, top + 1):
        most = problem.num_devices // (p * v.width)
        for d in splits:
            if d > most:
                break
            if p * d * v.width >= space.min_devices:
                yield p, d


def cut_options(num_layers: int, pp: int) -> Iterator[list[tuple[int, int]]]:
    """Every split of layers 0..num_layers-1 into pp contiguous non-empty stages."""
    for inner in itertools.combinations(range(1, num_layers), pp - 1):
        bounds = (0, *inner, num_layers)
        yield [(bounds[i], bounds[i + 1] - 1) for i in range(pp)]


def count_plans(problem: Problem, space: SearchSpace) -> int:
    n = problem.graph.num_layers
    total = 0
    for cls in space.classes:
        v = cls[0]
        per_stage = len(space.zero_stages) * len(space.recompute_modes) * len(cls)
        for p, d in pp_dp_options(problem, space, v):
            total += (math.comb(n - 1, p - 1) * per_stage**p
                      * len(space.placements_for(v, p, d)))
    return total


def make_plan(problem: Problem, planner: str, v: Variant, pp: int, dp: int,
              cuts: list[tuple[int, int]], zero: list[int], recompute: list[str],
              placement: str, stage_variants: list[Variant] | None = None) -> Plan:
    """A plan of the space; `stage_variants` (heterogeneous stages, one class: same width and
    ep as v) gives each stage its own variant, v being the plan's (stage 0's)."""
    stages = stages_from_cuts(cuts, pp, dp, v.width, placement, zero, recompute,
                              tp=v.tp, cp=v.cp, ep=v.ep)
    if stage_variants is not None:
        v = stage_variants[0]
        assert all((u.width, u.ep) == (v.width, v.ep) for u in stage_variants)
        stages = tuple(s if u == v else replace(s, tp=u.tp, sp=u.sp, ep=u.ep, cp=u.cp)
                       for s, u in zip(stages, stage_variants))
    return Plan(planner=planner, model=problem.model_ref or problem.model.name,
                cluster=problem.cluster_ref or problem.cluster.name,
                num_devices=problem.num_devices, mbs=problem.mbs,
                global_batch=problem.training.global_batch,
                num_microbatches=problem.num_microbatches(dp, v.ep), tp=v.tp, pp=pp, dp=dp,
                ep=v.ep, cp=v.cp, sp=v.sp, stages=stages, placement=placement)


def enumerate_plans(problem: Problem, space: SearchSpace, planner: str = "exhaustive"
                    ) -> Iterator[Plan]:
    n = problem.graph.num_layers
    for cls in space.classes:
        v = cls[0]
        for p, d in pp_dp_options(problem, space, v):
            for placement in space.placements_for(v, p, d):
                for cuts in cut_options(n, p):
                    for vs in itertools.product(cls, repeat=p):
                        for zero in itertools.product(space.zero_stages, repeat=p):
                            for rec in itertools.product(space.recompute_modes, repeat=p):
                                yield make_plan(problem, planner, vs[0], p, d, cuts, list(zero),
                                                list(rec), placement, list(vs))
