"""Snakemake adapter: layer graph x cluster x planner -> plan JSON (or a no-plan record) and its
evaluation JSON (nest.point)."""
import json
import sys

from nest.evaluate import make_problem
from nest.graph.layer_graph import LayerGraph
from nest.point import plan_point
from nest.specs import validate

sm = snakemake  # noqa: F821 - injected by Snakemake
sys.stderr = sys.stdout = open(sm.log[0], "w")
p = sm.params
graph = LayerGraph.read(sm.input.graph)
problem = make_problem(p.model, p.cluster, p.num_devices, graph.mbs, graph=graph)
plan, evaluation = plan_point(p.planner, problem, p.model, p.cluster)
real = plan["schema"] == "nest.plan/v1"  # else a no-plan record
for d, path, schema in ((plan, sm.output.plan, "plan"),
                        (evaluation, sm.output.evaluation, "evaluation")):
    if real:
        validate(d, schema, path)
    open(path, "w").write(json.dumps(d, indent=1, sort_keys=True) + "\n")
print(f"{p.planner} {p.model} {p.cluster} N={p.num_devices}: {evaluation['reason'] or 'ok'}")
