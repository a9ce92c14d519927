"""Snakemake adapter: layer graph x cluster x every planner of one point -> each planner's plan
JSON (or no-plan / crash record) and its evaluation JSON (nest.experiments.run_point), each planner under the
runtime guard (_job.py), in one process: the graph is read and verified once, the point's
Problem (its cost tables) built once and shared by the planners (plan.smk)."""
from _job import point_problem, run_point, start, write_json

from nest.graph.layer_graph import LayerGraph
from nest.spec.catalog import validate

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
p = sm.params
graph = LayerGraph.read(sm.input.graph)
problem = point_problem(p.model, p.cluster, p.num_devices, graph, p.settings, sm.input.training)
for planner, plan_path, eval_path in zip(p.planners, sm.output.plans, sm.output.evaluations):
    plan, evaluation = run_point(planner, problem, p.model, p.cluster)
    real = plan["schema"] == "nest.plan/v1"  # else a no-plan record
    for d, path, schema in ((plan, plan_path, "plan"), (evaluation, eval_path, "evaluation")):
        if real:
            validate(d, schema, path)
        write_json(d, path)
    print(f"{planner} {p.model} {p.cluster} N={p.num_devices}: {evaluation['reason'] or 'ok'}",
          flush=True)
