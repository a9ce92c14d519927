"""Snakemake adapter: one point x every ablation planner -> one JSON of their plans and
evaluations (nest.experiments.run_point), written once all are done; each planner under the runtime guard."""
from _job import point_problem, run_point, start, write_json

from nest.graph.layer_graph import LayerGraph

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
w = sm.wildcards
graph = LayerGraph.read(sm.input.graph)
problem = point_problem(w.model, w.cluster, int(w.num_devices), graph, sm.params.settings,
                        sm.input.training)
rows = []
for planner in sm.params.planners:
    plan, evaluation = run_point(planner, problem, w.model, w.cluster)
    rows.append({"planner": planner, "plan": plan, "evaluation": evaluation})
    print(f"{planner}: {evaluation['time_per_batch_s']} {evaluation['reason']}", flush=True)
write_json({"schema": "nest.decomposition_point/v1", "rows": rows}, sm.output[0])
