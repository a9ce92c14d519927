"""nest plan's launchable search against scoring every plan of its space under the run's settings
that the other brute-force tests leave at their defaults: DAPPLE's pipeline form, an overlapped
(bucketed) gradient sync, overlap_p2p_comm, param_gather_overlap with BF16 gradient reduction,
and the critical-path form where the optimum is interleaved (the interleaved walk is exact under
it; the 1F1B part optimises the paper's form there, docs/planning.md). The cases come from
benchmarks/recipe_neighbourhood.py --tiny, where the optimum is pipelined (interleaved or 1F1B)."""

from __future__ import annotations

import pytest

from nest.problem.evaluate import evaluate, make_problem
from nest.solver.launchable import search_launchable
from nest.spec.settings import TrainingSettings, training_overrides
from test_launchable import brute_force, tiny8

SPACE = {"zero_stages": [0, 3], "recompute_modes": ["none", "full"], "max_pp": 4, "tp": [1],
         "cp": [1]}


@pytest.mark.parametrize("batch,settings,schedule", [
    (8, {"pipeline_time": "dapple", "dp_overlap": "bucketed", "overlap_p2p_comm": True},
     "interleaved"),
    (8, {"pipeline_time": "critical_path", "overlap_p2p_comm": True}, "interleaved"),
    (5, {"pipeline_time": "dapple", "dp_overlap": "stage"}, "1f1b"),
    (4, {"dp_overlap": "bucketed", "param_gather_overlap": True,
         "precision": {"grad_reduce": "bf16"}}, None),
])
def test_launchable_equals_brute_force_under_settings(tmp_path, batch, settings, schedule):
    tr = training_overrides(TrainingSettings(global_batch=batch), settings, "test")
    pr = make_problem(tiny8(tmp_path, 10), "tiny_cluster", 4, training=tr)
    T, plan, _, _ = search_launchable(pr, {"space": SPACE})
    bf_T, bf_plan = brute_force(pr, SPACE)
    if schedule:  # the case exercises the part of the search it is meant to
        assert bf_plan.schedule == schedule and bf_plan.pp > 1
    assert T == pytest.approx(bf_T, rel=1e-9)
    assert evaluate(plan, pr).time_per_batch_s == pytest.approx(T, rel=1e-9)
