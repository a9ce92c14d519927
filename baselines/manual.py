"""Manual baseline: the paper's Megatron-style configurations (docs/paper.md, config/paper/).

Follows Megatron-LM practice (Narayanan et al. 2021b, section 3): the transformer blocks split
evenly over p stages (the first stages take one more when p does not divide them), the embedding
on the first stage and the LM head on the last, Megatron's default rank order (tensor fastest,
then data, then pipeline: `replica_major`). Deliberate choices where the paper is silent:
recomputation is turned on only when the plan would not fit otherwise (none, then selective, then
full, as practitioners do) and there is no ZeRO (Megatron's default optimizer).
"""

from __future__ import annotations

from nest.evaluate import Problem, evaluate
from nest.graph.layer_graph import Variant
from nest.plan_spec import block_cuts
from nest.planners import NoPlan, NotApplicable
from nest.space import make_plan
from nest.specs import config_dir, read_yaml, shown


def manual_config(model: str, cluster: str, num_devices: int) -> tuple[int, int, int, int]:
    path = config_dir() / "paper" / "manual_configs.yaml"
    cfg = read_yaml(path)
    table = dict(cfg["default"].get(model, {}))
    table.update(cfg.get("by_cluster", {}).get(cluster, {}).get(model, {}))
    if num_devices not in table:
        raise NotApplicable(f"{shown(path)} has no Manual config for {model} at {num_devices} "
                            f"devices")
    try:
        p, d, t = (int(x) for x in str(table[num_devices]).split("/"))
    except ValueError:
        raise NoPlan(f"{shown(path)}: key '{model}.{num_devices}': expected 'p/d/t'") from None
    return p, d, t, int(cfg.get("ep", {}).get(model, 1))


def uniform_cuts(num_blocks: int, pp: int) -> list[tuple[int, int]]:
    """Layer-graph ranges: blocks spread evenly, embedding first, head last."""
    if pp > num_blocks:
        raise NoPlan(f"p={pp} exceeds the {num_blocks} transformer blocks")
    return block_cuts(num_blocks, pp)


def plan(problem: Problem, settings: dict):
    m = problem.model
    p, d, t, e = manual_config(m.name, problem.cluster.name, problem.num_devices)
    need = p * d * t * e
    if need > problem.num_devices:
        raise NoPlan(f"Manual {p}/{d}/{t} (ep={e}) needs {need} devices > {problem.num_devices}")
    gb = problem.training.global_batch
    if gb % (problem.mbs * d * e):
        raise NoPlan(f"Manual {p}/{d}/{t} (ep={e}): global batch {gb} is not a multiple of "
                     f"mbs x dp x ep = {problem.mbs * d * e}, so no whole number of "
                     f"micro-batches processes exactly the batch (Megatron-LM refuses it)")
    v = Variant(tp=t, sp=False, ep=e, cp=1)
    problem = problem.with_variants([v])
    cuts = uniform_cuts(m.num_layers, p)
    plan_, ev = least_recompute(problem, "manual", v, p, d, cuts, settings.get("zero_stage", 0),
                                settings.get("recompute_order", RECOMPUTE_ORDER))
    if ev.feasible:
        return plan_
    raise NoPlan(f"Manual {p}/{d}/{t} (ep={e}) does not fit even with full recomputation: "
                 f"{ev.reason}")


RECOMPUTE_ORDER = ("none", "selective", "full")


def least_recompute(problem: Problem, planner: str, v: Variant, p: int, d: int, cuts,
                    zero: int = 0, order=RECOMPUTE_ORDER):
    """The plan with the first recomputation mode of `order` (all stages alike) under which the
    shared evaluator says it fits (practitioners turn recomputation on only when needed), and its
    evaluation; the last mode's plan and evaluation when none fits."""
    for mode in order:
        candidate = make_plan(problem, planner, v, p, d, cuts, [zero] * p, [mode] * p,
                              "replica_major")
        ev = evaluate(candidate, problem)
        if ev.feasible:
            return candidate.with_(predicted_time_per_batch_s=ev.time_per_batch_s), ev
    return candidate, ev
