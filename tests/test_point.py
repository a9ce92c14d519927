"""nest.experiments.run_point: a stored plan and its stored evaluation agree, and the results table of records
equals the one of the same records written to files (the plan rule's and the decomposition's
paths give the same CSV rows)."""

import json

from nest.problem.evaluate import evaluate, make_problem
from nest.problem.plan import Plan
from nest.experiments.run_point import plan_point
from nest.experiments.results import collect, collect_records
from nest.spec.settings import TrainingSettings


def test_point_records_equal_file_records(tmp_path):
    pr = make_problem("tiny_gpt", "tiny_cluster", 4, training=TrainingSettings(global_batch=8))
    records, pairs = [], []
    for i, planner in enumerate(["manual", "nest", "paper_manual"]):
        plan, ev = plan_point(planner, pr, "tiny_gpt", "tiny_cluster")
        records.append((ev, plan))
        e, p = tmp_path / f"e{i}.json", tmp_path / f"p{i}.json"
        e.write_text(json.dumps(ev))
        p.write_text(json.dumps(plan))
        pairs.append((e, p))
    assert collect_records(records).equals(collect(pairs))
    status = dict(zip(collect_records(records).planner, collect_records(records).status))
    assert status["paper_manual"] == "not_applicable"  # the artifact has no tiny plans
    plan, ev = records[1][1], records[1][0]
    again = evaluate(Plan.from_dict(plan), pr)
    assert ev["feasible"] and again.time_per_batch_s == ev["time_per_batch_s"]
