"""Snakemake adapter: plan JSON -> evaluation JSON (shared evaluator)."""
import json
import sys

from nest.evaluate import evaluate, make_problem
from nest.graph.layer_graph import LayerGraph
from nest.plan import Plan
from nest.results import NO_PLAN_SCHEMA, no_plan_evaluation

sm = snakemake  # noqa: F821 - injected by Snakemake
sys.stderr = sys.stdout = open(sm.log[0], "w")
raw = json.loads(open(sm.input.plan).read())
if raw.get("schema") == NO_PLAN_SCHEMA:
    ev = no_plan_evaluation(raw)
    open(sm.output[0], "w").write(json.dumps(ev, indent=1, sort_keys=True) + "\n")
else:
    plan = Plan.from_dict(raw, sm.input.plan)
    graph = LayerGraph.read(sm.input.graph)
    problem = make_problem(plan.model, plan.cluster, plan.num_devices, plan.mbs, graph=graph)
    result = evaluate(plan, problem, simulated=True)  # the simulated time rides along
    result.write(sm.output[0])
    print(f"feasible={result.feasible} time={result.time_per_batch_s} {result.reason}")
