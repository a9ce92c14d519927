"""The training settings' cost_scale (nest.spec.settings.CostScale): compute and communication times
scaled where they enter the cost tables, so planners re-plan and the evaluator scores under the
same perturbed model. Checked against closed forms: with no communication (one device) the time
scales by exactly the compute factor; with both factors equal the objective is homogeneous of
degree 1, so every time scales by k and the optimum plan is the same plan."""

import math

import pytest

from nest.common.errors import SpecError
from nest.problem.evaluate import evaluate, make_problem
from nest.planners.registry import run_planner
from nest.spec.settings import CostScale, TrainingSettings, load_training

COMPUTE = ("compute_fwd", "compute_bwd", "recompute", "optimizer_step")
REL = 1e-12


def _tr(compute=1.0, communication=1.0, **kw):
    return TrainingSettings(global_batch=8, cost_scale=CostScale(compute, communication), **kw)


def _same_plan(a, b):
    skip = {"predicted_time_per_batch_s", "solve_time_s", "notes", "extra"}  # extra: bandwidths
    da, db = a.to_dict(), b.to_dict()
    return {k: v for k, v in da.items() if k not in skip} == \
        {k: v for k, v in db.items() if k not in skip}


@pytest.mark.parametrize("k", [0.85, 1.15, 3.0])
def test_one_device_time_scales_by_the_compute_factor(k):
    base = make_problem("tiny_gpt", "tiny_cluster", 1, training=_tr())
    out = run_planner("nest", base)
    assert out.evaluation.feasible
    assert not [n for n in out.evaluation.breakdown_s
                if not n.startswith(("stage0.compute", "stage0.recompute", "optimizer",
                                     "pipeline_bubble"))]  # no network term on one device
    pert = make_problem("tiny_gpt", "tiny_cluster", 1, training=_tr(compute=k))
    again = evaluate(out.plan, pert)
    assert math.isclose(again.time_per_batch_s, k * out.evaluation.time_per_batch_s, rel_tol=REL)
    # communication alone changes nothing where there is none
    comm = make_problem("tiny_gpt", "tiny_cluster", 1, training=_tr(communication=k))
    assert evaluate(out.plan, comm).time_per_batch_s == out.evaluation.time_per_batch_s


@pytest.mark.parametrize("k", [0.7, 1.3])
@pytest.mark.parametrize("model,n", [("tiny_gpt", 8), ("tiny_moe", 4)])
def test_both_factors_scale_every_time_and_keep_the_plan(model, n, k):
    """The objective is homogeneous: T(plan; k c, k m) = k T(plan; c, m) for every plan, so the
    planner's optimum is the same plan and every breakdown term scales by k."""
    base = make_problem(model, "tiny_cluster", n, training=_tr())
    pert = make_problem(model, "tiny_cluster", n, training=_tr(k, k))
    for planner in ("nest", "manual", "phaze"):
        a, b = run_planner(planner, base), run_planner(planner, pert)
        assert a.plan is not None and b.plan is not None, planner
        assert _same_plan(a.plan, b.plan), planner
        ea, eb = a.evaluation, b.evaluation
        assert math.isclose(eb.time_per_batch_s, k * ea.time_per_batch_s, rel_tol=1e-9)
        assert set(ea.breakdown_s) == set(eb.breakdown_s)
        for name, x in ea.breakdown_s.items():
            assert math.isclose(eb.breakdown_s[name], k * x, rel_tol=1e-9, abs_tol=1e-18), name


def test_communication_factor_scales_network_terms_only():
    base = make_problem("tiny_gpt", "tiny_cluster", 8, training=_tr())
    plan = run_planner("nest", base).plan
    ea = evaluate(plan, base)
    eb = evaluate(plan, make_problem("tiny_gpt", "tiny_cluster", 8, training=_tr(1.0, 1.3)))
    net = [n for n in ea.breakdown_s if n.startswith(("dp_sync", "p2p", "tp_", "ep_", "cp_"))
           or ".tp_" in n or ".p2p" in n]
    assert net, ea.breakdown_s  # the plan communicates
    for name, x in ea.breakdown_s.items():
        if name.split(".")[-1] in COMPUTE or name in COMPUTE:
            assert eb.breakdown_s[name] == x, name
        elif name in net:
            assert math.isclose(eb.breakdown_s[name], 1.3 * x, rel_tol=1e-12), name


def test_unit_scale_is_the_model_as_it_is():
    pr = make_problem("tiny_gpt", "tiny_cluster", 8, training=_tr())
    plain = make_problem("tiny_gpt", "tiny_cluster", 8, training=TrainingSettings(global_batch=8))
    assert pr.cluster is not None and pr.cluster == plain.cluster and pr.costs.scale == 1.0
    assert pr.cluster.comm_scale == 1.0
    assert load_training().cost_scale == CostScale()  # config/training.yaml's default


def test_scale_applied_once():
    """Whatever rebuilds the problem (a new cluster, new settings, more variants) applies the
    factor to the cluster as described, never on top of an already scaled one."""
    pr = make_problem("tiny_gpt", "tiny_cluster", 8, training=_tr(1.15, 1.3))
    lv = make_problem("tiny_gpt", "tiny_cluster", 8, training=_tr()).cluster.levels[1]
    for p in (pr, pr.with_cluster(pr.cluster), pr.with_training(pr.training), pr.with_mbs(2)):
        assert p.cluster.comm_scale == 1.3 and p.costs.scale == 1.15
        assert math.isclose(p.cluster.levels[1].bytes_per_s, lv.bytes_per_s / 1.3, rel_tol=REL)
        assert math.isclose(p.cluster.levels[1].latency_s, lv.latency_s * 1.3, rel_tol=REL)
    back = pr.with_training(pr.training.with_(cost_scale=CostScale()))
    assert math.isclose(back.cluster.levels[1].bytes_per_s, lv.bytes_per_s, rel_tol=REL)


@pytest.mark.parametrize("bad", ["0", "-1", ".nan", ".inf", "true", "'x'", "{a: 1}"])
def test_bad_cost_scale_names_file_and_key(tmp_path, bad):
    src = load_training.__globals__["config_dir"]() / "training.yaml"
    text = src.read_text().replace("  compute: 1.0 ", f"  compute: {bad} ", 1)
    assert text != src.read_text()
    p = tmp_path / "training.yaml"
    p.write_text(text)
    with pytest.raises(SpecError, match=r"training\.yaml.*cost_scale"):
        load_training(p)


def test_planners_own_network_views_follow_the_scale():
    """Views built from the problem's cluster (flat network, Alpa's 2-D mesh, Phaze's explicit
    flat bandwidth, given as described) carry the scale, never twice."""
    from baselines.alpa_e_ilp import mesh_view
    from nest.network.collectives import flattened, path_bandwidth

    plain = make_problem("tiny_gpt", "tiny_cluster", 8, training=_tr()).cluster
    cl = make_problem("tiny_gpt", "tiny_cluster", 8, training=_tr(1.0, 1.3)).cluster
    for view in (lambda c: flattened(c), lambda c: flattened(c, 2e9), mesh_view):
        a, b = view(plain), view(cl)
        assert b.comm_scale == 1.3
        for i in range(len(a.levels)):
            assert math.isclose(path_bandwidth(b, i), path_bandwidth(a, i) / 1.3, rel_tol=REL)
            assert math.isclose(b.levels[i].latency_s, a.levels[i].latency_s * 1.3, rel_tol=REL)
