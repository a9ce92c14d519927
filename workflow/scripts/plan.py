"""Snakemake adapter: layer graph x cluster x planner -> plan JSON (or a no-plan record) and its
evaluation JSON (the shared evaluator on the plan read back from the file it was written to)."""
import json
import sys

from nest.evaluate import evaluate, make_problem
from nest.graph.layer_graph import LayerGraph
from nest.plan import Plan
from nest.planners import run_planner
from nest.results import no_plan_evaluation, no_plan_record

sm = snakemake  # noqa: F821 - injected by Snakemake
sys.stderr = sys.stdout = open(sm.log[0], "w")
p = sm.params
graph = LayerGraph.read(sm.input.graph)
problem = make_problem(p.model, p.cluster, p.num_devices, graph.mbs, graph=graph)
out = run_planner(p.planner, problem)
if out.plan is None:
    rec = no_plan_record(p.planner, p.model, p.cluster, p.num_devices, graph.mbs, out.reason,
                         out.solve_time_s, out.status)
    open(sm.output.plan, "w").write(json.dumps(rec, indent=1, sort_keys=True) + "\n")
    ev = no_plan_evaluation(rec)
    open(sm.output.evaluation, "w").write(json.dumps(ev, indent=1, sort_keys=True) + "\n")
else:
    out.plan.write(sm.output.plan)
    plan = Plan.from_dict(json.loads(open(sm.output.plan).read()), sm.output.plan)
    if plan.mbs != graph.mbs:  # a planner that searched the micro-batch size
        problem = make_problem(plan.model, plan.cluster, plan.num_devices, plan.mbs)
    result = evaluate(plan, problem, simulated=True)  # the simulated time rides along
    result.write(sm.output.evaluation)
    print(f"feasible={result.feasible} time={result.time_per_batch_s} {result.reason}")
print(f"{p.planner} {p.model} {p.cluster} N={p.num_devices}: "
      f"{'plan' if out.plan else 'no plan'} in {out.solve_time_s:.3f} s {out.reason}")
