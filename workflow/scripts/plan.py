"""Snakemake adapter: layer graph x cluster x planner -> plan JSON (or a no-plan record)."""
import json
import sys

from nest.evaluate import make_problem
from nest.graph.layer_graph import LayerGraph
from nest.planners import run_planner
from nest.results import no_plan_record

sm = snakemake  # noqa: F821 - injected by Snakemake
sys.stderr = sys.stdout = open(sm.log[0], "w")
p = sm.params
graph = LayerGraph.read(sm.input.graph)
problem = make_problem(p.model, p.cluster, p.num_devices, graph.mbs, graph=graph)
out = run_planner(p.planner, problem)
if out.plan is None:
    rec = no_plan_record(p.planner, p.model, p.cluster, p.num_devices, graph.mbs, out.reason,
                         out.solve_time_s, out.status)
    open(sm.output[0], "w").write(json.dumps(rec, indent=1, sort_keys=True) + "\n")
else:
    out.plan.write(sm.output[0])
print(f"{p.planner} {p.model} {p.cluster} N={p.num_devices}: "
      f"{'plan' if out.plan else 'no plan'} in {out.solve_time_s:.3f} s {out.reason}")
