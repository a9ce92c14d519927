"""Snakemake adapter: one model on one cluster (its device counts) under every perturbed cost
model (training setting cost_scale) -> one JSON per perturbation: the re-planned planners' plans
and evaluations (nest.experiments.run_point, under the runtime guard) and the rescored ones' unperturbed plans
scored by the perturbed evaluator (nest.experiments.robustness)."""
import json
from pathlib import Path

from _job import point_problem, run_point, start, write_json

from nest.graph.layer_graph import LayerGraph
from nest.experiments.robustness import point_record, rescore
from nest.spec.settings import CostScale

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
w, p = sm.wildcards, sm.params
graph = LayerGraph.read(sm.input.graph)
stored = [json.loads(Path(f).read_text()) for f in sm.input.rescored]
for (c, m), out in zip(p.scales, sm.output):
    plans = iter(stored)
    rows = []
    for n, replan, rescored in p.points:
        problem = point_problem(w.model, w.cluster, n, graph, p.settings, sm.input.training
                                ).with_training(cost_scale=CostScale(c, m))
        for planner in replan:
            plan, evaluation = run_point(planner, problem, w.model, w.cluster)
            rows.append({"planner": planner, "mode": "replanned", "plan": plan,
                         "evaluation": evaluation})
            print(f"c={c} m={m} N={n} {planner}: {evaluation['time_per_batch_s']} "
                  f"{evaluation['reason']}", flush=True)
        for planner in rescored:
            plan, evaluation = rescore(next(plans), problem)
            rows.append({"planner": planner, "mode": "rescored", "plan": plan,
                         "evaluation": evaluation})
            print(f"c={c} m={m} N={n} {planner} (rescored): {evaluation['time_per_batch_s']}",
                  flush=True)
    write_json(point_record(rows, c, m), out)
