"""Snakemake adapter: one point x every ablation planner -> one JSON of their plans and
evaluations (nest.point), written once all are done."""
import json
import sys

from nest.evaluate import make_problem
from nest.graph.layer_graph import LayerGraph
from nest.point import plan_point

sm = snakemake  # noqa: F821 - injected by Snakemake
sys.stderr = sys.stdout = open(sm.log[0], "w")
w = sm.wildcards
graph = LayerGraph.read(sm.input.graph)
problem = make_problem(w.model, w.cluster, int(w.num_devices), graph.mbs, graph=graph)
rows = []
for planner in sm.params.planners:
    plan, evaluation = plan_point(planner, problem, w.model, w.cluster)
    rows.append({"planner": planner, "plan": plan, "evaluation": evaluation})
    print(f"{planner}: {evaluation['time_per_batch_s']} {evaluation['reason']}", flush=True)
open(sm.output[0], "w").write(json.dumps({"schema": "nest.decomposition_point/v1", "rows": rows},
                                         indent=1, sort_keys=True) + "\n")
