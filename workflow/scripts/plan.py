"""Snakemake adapter: layer graph x cluster x planner -> plan JSON (or a no-plan / crash record)
and its evaluation JSON (nest.experiments.run_point), under the runtime guard (_job.py)."""
from _job import point_problem, run_point, start, write_json

from nest.graph.layer_graph import LayerGraph
from nest.spec.catalog import validate

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
p = sm.params
graph = LayerGraph.read(sm.input.graph)
problem = point_problem(p.model, p.cluster, p.num_devices, graph, p.settings, sm.input.training)
plan, evaluation = run_point(p.planner, problem, p.model, p.cluster)
real = plan["schema"] == "nest.plan/v1"  # else a no-plan record
for d, path, schema in ((plan, sm.output.plan, "plan"),
                        (evaluation, sm.output.evaluation, "evaluation")):
    if real:
        validate(d, schema, path)
    write_json(d, path)
print(f"{p.planner} {p.model} {p.cluster} N={p.num_devices}: {evaluation['reason'] or 'ok'}")
