"""Manual baseline: the paper's Megatron-style configurations (docs/paper.md, config/paper/).

Follows Megatron-LM practice (Narayanan et al. 2021b, section 3): the transformer blocks split
evenly over p stages (the first stages take one more when p does not divide them), the embedding
on the first stage and the LM head on the last, Megatron's default rank order (tensor fastest,
then data, then pipeline: `replica_major`). Deliberate choices where the paper is silent:
recomputation is turned on only when the plan would not fit otherwise (none, then selective, then
full, as practitioners do) and there is no ZeRO (Megatron's default optimizer).
"""

from __future__ import annotations

from nest.problem.evaluate import Problem, evaluate
from nest.graph.layer_graph import Variant
from nest.problem.plan_spec import block_cuts
from nest.planners.registry import NoPlan, NotApplicable
from nest.problem.space import make_plan
from nest.spec.catalog import config_dir, read_yaml, shown


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
        raise NoPlan(f"Manual {p}/{d}/{t} (ep={e}) needs {need} devices > {problem.num_devices}",
                     kind="devices")
    problem, adjusted = on_processed_batch(problem, d, e, f"Manual {p}/{d}/{t} (ep={e})")
    v = Variant(tp=t, sp=False, ep=e, cp=1)
    problem = problem.with_variants([v])
    cuts = uniform_cuts(m.num_layers, p)
    plan_, ev = least_recompute(problem, "manual", v, p, d, cuts, settings.get("zero_stage", 0),
                                settings.get("recompute_order", RECOMPUTE_ORDER))
    if ev.feasible:
        return plan_.with_(**adjusted)
    raise NoPlan(f"Manual {p}/{d}/{t} (ep={e}) does not fit even with full recomputation: "
                 f"{ev.reason}", kind="memory")


RECOMPUTE_ORDER = ("none", "selective", "full")


def processed_batch(global_batch: int, split: int) -> int:
    """The batch a plan of `split` = mbs x dp x ep samples per micro-batch step processes when
    the configured global batch is not a multiple of it: the largest multiple of split not above
    the configured batch (the launcher's global batch rounded down to whole micro-batches, so no
    sample is counted that the configured batch does not hold); 0 if split exceeds it."""
    return global_batch // split * split


def on_processed_batch(problem: Problem, dp: int, ep: int, who: str):
    """(problem, plan fields) for a replayed plan of data-parallel degree dp and ep: the problem
    unchanged and no fields where mbs x dp x ep divides the global batch; otherwise the problem
    at the processed batch (`processed_batch`) and the fields that flag it (extra
    ["batch_configured"], a note), so that the shared evaluator scores the plan on the batch it
    processes and its throughput (samples per second) compares with the other planners'.
    NoPlan(kind="batch") if one micro-batch step already exceeds the global batch."""
    gb = problem.training.global_batch
    split = problem.mbs * dp * ep
    if gb % split == 0:
        return problem, {}
    done = processed_batch(gb, split)
    if done == 0:
        raise NoPlan(f"{who}: mbs x dp x ep = {split} exceeds the global batch {gb}",
                     kind="batch")
    note = (f"global batch {gb} is not a multiple of mbs x dp x ep = {split}: scored on the "
            f"{done} samples it processes ({done // split} micro-batches per replica)")
    return problem.with_training(global_batch=done), {"extra": {"batch_configured": gb},
                                                      "notes": note}


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
