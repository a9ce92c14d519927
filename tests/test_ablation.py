"""NEST's ablations (nest.experiments.decomposition, config/planners.yaml nest_*): the solver switches are exact
(even cuts == brute force over even splits), every ablation is no faster than NEST, the
flat-network plan is scored on the real cluster; the decomposition table and the co-design sweep
(resumable cache, deterministic output)."""

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from nest.experiments import decomposition as ablation
from nest.common.errors import SpecError
from nest.problem.evaluate import evaluate, make_problem
from nest.graph import build_graph
from nest.network.collectives import flattened
from nest.planners.registry import planner_entry, run_planner
from nest.spec.settings import TrainingSettings
from nest.solver import search
from nest.solver.arrays import even_cut_mask
from nest.problem.space import declare, enumerate_plans

REL = 1e-9
SPACE = {"zero_stages": [0, 3], "recompute_modes": ["none", "full"]}


def blocks_per_stage(problem, plan):
    kinds = [la.kind for la in problem.graph.layers]
    return [sum(k == "block" for k in kinds[s.first_layer:s.last_layer + 1]) for s in plan.stages]


def deeper(problem, num_layers):
    """The same problem with a model of `num_layers` blocks (an odd count makes uneven splits)."""
    m = replace(problem.model, num_layers=num_layers, name=f"{problem.model.name}_{num_layers}l")
    return problem.with_graph(build_graph(m, problem.mbs, problem.training.graph_source), m)


def test_even_cut_mask():
    pr = deeper(make_problem("tiny_llama", "tiny_cluster", 4), 5)  # embedding, 5 blocks, head
    L = pr.graph.num_layers
    assert L == 7
    m = even_cut_mask(pr, 2)  # 2 or 3 blocks per stage
    for b in range(L):
        for a in range(L):
            blocks = sum(1 for i in range(a, b + 1) if 1 <= i <= 5)
            assert m[b, a] == (a <= b and blocks in (2, 3)), (a, b)
    assert not even_cut_mask(pr, 6).any()  # more stages than blocks: nothing fits
    assert even_cut_mask(pr, 5)[1, 0] and even_cut_mask(pr, 5)[6, 5]  # embedding / head ride along


def brute_force_even(problem, space_overrides):
    """Every plan of the space whose stages hold floor or ceil of blocks / p blocks, scored by
    the evaluator: the least time per batch (inf if none fits)."""
    space = declare(problem, space_overrides)
    best = math.inf
    kinds = [la.kind for la in problem.graph.layers]
    B = kinds.count("block")
    for plan in enumerate_plans(problem, space):
        counts = [kinds[s.first_layer:s.last_layer + 1].count("block") for s in plan.stages]
        lo, hi = B // plan.pp, -(-B // plan.pp)
        if min(counts) < max(lo, 1) or max(counts) > hi:
            continue
        ev = evaluate(plan, problem)
        if ev.feasible:
            best = min(best, ev.time_per_batch_s)
    return best


@pytest.mark.parametrize("model,blocks,n,batch,hbm", [
    ("tiny_llama", 5, 4, 8, None),
    ("tiny_llama", 5, 4, 8, 0.03e9),     # tight memory: ZeRO / recomputation / deep pipelines
    ("tiny_gpt", 4, 4, 16, None),        # tp2 / sp variants, heterogeneous stages
    ("tiny_gpt", 3, 8, 8, None),
])
def test_even_cuts_equal_brute_force(model, blocks, n, batch, hbm):
    pr = make_problem(model, "tiny_cluster", n, training=TrainingSettings(global_batch=batch))
    pr = deeper(pr, blocks)
    if hbm:
        pr = pr.with_hardware(hbm_bytes=hbm)
    space = {**SPACE, "heterogeneous_stages": True, "max_pp": 4}
    out = run_planner("nest", pr, {"space": space, "even_cuts": True})
    expect = brute_force_even(pr, space)
    if not math.isfinite(expect):
        assert out.plan is None and "even cuts" in out.reason
        return
    assert out.evaluation.feasible
    counts = blocks_per_stage(pr, out.plan)
    assert max(counts) - min(counts) <= 1 and min(counts) >= 1
    assert out.evaluation.time_per_batch_s == pytest.approx(expect, rel=REL)
    assert out.plan.predicted_time_per_batch_s == pytest.approx(expect, rel=REL)
    free = run_planner("nest", pr, {"space": space})
    assert free.evaluation.time_per_batch_s <= expect * (1 + REL)


ABLATIONS = list(ablation.CAPABILITIES)


@pytest.mark.parametrize("model,n,batch,hbm", [
    ("tiny_gpt", 4, 8, 0.02e9),    # NEST's optimum recomputes one stage only
    ("tiny_gpt", 4, 16, 0.03e9),   # one mode fits every stage
])
def test_homogeneous_is_one_megatron_run(model, n, batch, hbm):
    """nest_homogeneous is what one Megatron-LM run expresses (one variant, one ZeRO stage, one
    recomputation mode: --use-distributed-optimizer and --recompute-granularity are global):
    its time equals the best such plan found by scoring every plan of the space, and where the
    best plan with stage-wise modes is faster, it is not returned."""
    from nest.solver.launchable import differs

    pr = make_problem(model, "tiny_cluster", n, training=TrainingSettings(global_batch=batch))
    pr = pr.with_hardware(hbm_bytes=hbm)
    space = {**SPACE, "max_pp": 4}
    out = run_planner("nest_homogeneous", pr, {"space": {**space, "heterogeneous_stages": False}})
    uniform = mixed = math.inf
    for plan in enumerate_plans(pr, declare(pr, space)):
        ev = evaluate(plan, pr)
        if ev.feasible:
            mixed = min(mixed, ev.time_per_batch_s)
            if not differs(plan):
                uniform = min(uniform, ev.time_per_batch_s)
    assert out.evaluation.feasible and not differs(out.plan)
    assert out.evaluation.time_per_batch_s == pytest.approx(uniform, rel=REL)
    assert out.plan.schedule == "1f1b" and out.plan.mbs == pr.mbs
    if hbm == 0.02e9:  # the stage-wise optimum the old ablation returned is strictly faster
        assert mixed < uniform * (1 - 1e-3)


def test_registry_has_every_ablation():
    nest_space = planner_entry("nest")[1]["space"]
    for name in ABLATIONS:
        entry, settings = planner_entry(name)
        assert entry == "nest.solver:plan"
        space = settings.get("space", {})
        # NEST's settings but the one switch
        assert space.get("heterogeneous_stages") == (name != "nest_homogeneous")
        assert set(settings) | {"space"} <= {"space", "network", "even_cuts", "launchable",
                                             "interleaved"}
        # the schedule and the micro-batch stay the paper's: interleaving is not an ablation
        assert settings.get("interleaved", False) is False and "mbs_options" not in settings
        assert {k for k in space if space[k] != nest_space.get(k)} or set(settings) - {"space"}


@pytest.mark.parametrize("model,n,batch,hbm", [
    ("tiny_gpt", 4, 16, None), ("tiny_gpt", 8, 8, 0.02e9), ("tiny_llama", 8, 16, None),
    ("tiny_moe", 4, 8, None), ("tiny_moe", 8, 8, 0.02e9)])
def test_no_ablation_beats_nest(model, n, batch, hbm):
    """Each ablated space is a subset of NEST's (the flat-network plan one of NEST's plans): on
    the real network no ablation is faster than NEST, and none fits where NEST does not."""
    pr = make_problem(model, "tiny_cluster", n, training=TrainingSettings(global_batch=batch))
    if hbm:
        pr = pr.with_hardware(hbm_bytes=hbm)
    ref = run_planner("nest", pr)
    for name in ABLATIONS:
        out = run_planner(name, pr)
        assert out.status in ("feasible", "no_plan"), (name, out.reason)
        if out.status == "feasible":
            assert ref.status == "feasible", name
            assert out.evaluation.time_per_batch_s >= ref.evaluation.time_per_batch_s * (
                1 - REL), name


def test_flat_network_plans_blind_and_scores_real():
    pr = make_problem("tiny_gpt", "tiny_cluster", 8, training=TrainingSettings(global_batch=16))
    out = run_planner("nest_flat_network", pr)
    assert out.status == "feasible"
    assert out.plan.cluster == "tiny_cluster" and out.plan.planner == "nest_flat_network"
    # the plan is the flattened network's optimum ...
    blind = pr.with_cluster(flattened(pr.cluster))
    space = declare(blind, planner_entry("nest_flat_network")[1]["space"])
    T_flat, best, _ = search(blind, space)
    assert out.plan.predicted_time_per_batch_s == pytest.approx(T_flat, rel=REL)
    assert [(s.first_layer, s.last_layer) for s in out.plan.stages] == [
        (a, b) for a, b, _ in best[4]]
    assert evaluate(out.plan, blind).time_per_batch_s == pytest.approx(T_flat, rel=REL)
    # ... scored on the real one, where it is no better than NEST's
    real = evaluate(out.plan, pr)
    assert real.feasible
    assert out.evaluation.time_per_batch_s == pytest.approx(real.time_per_batch_s, rel=REL)
    assert real.time_per_batch_s >= run_planner("nest", pr).evaluation.time_per_batch_s * (
        1 - REL)


def test_flat_network_pays_on_a_slow_oversubscribed_network():
    """The blind plan is strictly slower where the network above the node is slow."""
    d = ablation.derive_cluster_dict(
        {"name": "t", "hardware": "tiny_accel", "levels": [
            {"name": "node", "devices_per_group": 2, "bandwidth_GBps": 50, "latency_us": 1.0},
            {"name": "rack", "devices_per_group": 4, "bandwidth_GBps": 5, "latency_us": 5.0},
            {"name": "top", "devices_per_group": 16, "bandwidth_GBps": 5, "latency_us": 10.0}],
         "source": "test"},
        0.5, 4)
    assert [lv["bandwidth_GBps"] for lv in d["levels"]] == [50, 0.5, 0.5]
    assert [lv.get("oversubscription", 1) for lv in d["levels"]] == [1, 1, 4]
    from nest.spec.catalog import cluster_from_dict

    pr = make_problem("tiny_gpt", "tiny_cluster", 4, training=TrainingSettings(global_batch=8))
    pr = pr.with_cluster(cluster_from_dict(d, "test", 4)).with_hardware(hbm_bytes=0.03e9)
    flat = run_planner("nest_flat_network", pr).evaluation.time_per_batch_s
    aware = run_planner("nest", pr).evaluation.time_per_batch_s
    assert flat > aware * 1.01


def test_bad_switch_values_name_the_key():
    pr = make_problem("tiny_llama", "tiny_cluster", 4, training=TrainingSettings(global_batch=8))
    with pytest.raises(SpecError, match="settings.network"):
        run_planner("nest", pr, {"network": "blind"})
    with pytest.raises(SpecError, match="settings.even_cuts"):
        run_planner("nest", pr, {"even_cuts": "yes"})


def test_restricted_space_infeasibility_names_the_restriction():
    pr = make_problem("tiny_gpt", "tiny_cluster", 4, training=TrainingSettings(global_batch=8))
    # 20 MB: the full space fits (from 19 MB), ZeRO-0 without recomputation does not (22 MB+)
    pr = pr.with_hardware(hbm_bytes=0.020e9)
    assert run_planner("nest", pr).status == "feasible"
    out = run_planner("nest", pr, {"space": {"zero_stages": [0], "recompute_modes": ["none"]}})
    assert out.status == "no_plan"
    assert "ZeRO stages [0]" in out.reason and "recomputation ['none']" in out.reason


# -- the decomposition table ---------------------------------------------------------------------
def frame(rows):
    cols = ["model", "cluster", "num_devices", "mbs", "planner", "status", "feasible",
            "time_per_batch_s"]
    return pd.DataFrame([dict(zip(cols, r)) for r in rows])


def test_decomposition_table():
    df = frame([
        ("a", "c1", 64, 1, "nest", "feasible", True, 1.0),
        ("a", "c1", 64, 1, "nest_no_zero", "feasible", True, 1.5),
        ("b", "c1", 64, 1, "nest", "feasible", True, 2.0),
        ("b", "c1", 64, 1, "nest_no_zero", "no_plan", False, None),
        ("a", "c1", 128, 1, "nest", "feasible", True, 1.0),
        ("a", "c1", 128, 1, "nest_no_zero", "feasible", True, 1.0),
        ("a", "c2", 64, 1, "nest", "no_plan", False, None),
        ("a", "c2", 64, 1, "nest_no_zero", "no_plan", False, None),
        ("b", "c2", 64, 1, "nest", "feasible", True, 1.0),
        ("b", "c2", 64, 1, "nest_no_zero", "crashed", False, None),
    ])
    t = ablation.decomposition_table(df, "nest", ["nest_no_zero"])
    assert list(t.columns) == ablation.TABLE_COLUMNS
    r1 = t[t.cluster == "c1"].iloc[0]
    assert (r1.points, r1.points_both_feasible, r1.points_equal) == (3, 2, 1)
    assert (r1.mean_ratio, r1.min_ratio, r1.max_ratio) == (1.25, 1.0, 1.5)
    assert r1.points_only_nest_feasible == 1 and r1.points_ablation_faster == 0
    r2 = t[t.cluster == "c2"].iloc[0]
    assert r2.points_both_feasible == 0 and math.isnan(r2.mean_ratio)
    assert r2.points_only_nest_feasible == 0 and r2.points_crashed == 1
    md = ablation.decomposition_markdown(t)
    assert "| ZeRO (nest_no_zero) | c1 | 2/3 | 1.250x | 1.000-1.500x | 1 | 1 |" in md
    assert "no ablation is faster" in md


def test_decomposition_figure_is_deterministic(tmp_path):
    df = frame([(m, c, n, 1, p, "feasible", True, t)
                for m in ("a", "b") for c in ("c1", "c2") for n in (64, 128)
                for p, t in (("nest", 1.0), ("nest_no_zero", 1.2), ("nest_even_cuts", 1.0))])
    t = ablation.decomposition_table(df, "nest", ["nest_no_zero", "nest_even_cuts"])
    out = []
    for k in range(2):
        png, pdf = tmp_path / f"{k}.png", tmp_path / f"{k}.pdf"
        ablation.plot_decomposition(df, t, png, pdf)
        out.append((png.read_bytes(), pdf.read_bytes()))
    assert out[0] == out[1]


# -- the co-design sweep -------------------------------------------------------------------------
def test_codesign_sweep_resumes_from_its_cache(tmp_path, monkeypatch):
    import nest.planners.registry

    args = ("tiny_gpt", "tiny_cluster", [4], [0.5, 5.0], [1, 4], tmp_path / "cache")
    kw = {"training": TrainingSettings(global_batch=8), "log": lambda s: None}
    df = ablation.codesign_sweep(*args, inputs_digest="x", **kw)
    assert list(df.columns) == ablation.CODESIGN_COLUMNS and len(df) == 4
    assert (df.gain.astype(float) >= 1 - REL).all()
    assert len(list((tmp_path / "cache").glob("*.json"))) == 4
    # a slow, oversubscribed network: the flat plan loses
    slow = df[(df.inter_node_bandwidth_GBps == 0.5) & (df.oversubscription == 4)].iloc[0]
    assert slow.gain > 1.01
    # flat plans do not depend on the real network: one plan for all four cells
    assert df.flat_plan.nunique() == 1
    # resumed: nothing is solved again, the same frame comes back
    monkeypatch.setattr(nest.planners.registry, "run_planner",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("re-solved")))
    again = ablation.codesign_sweep(*args, inputs_digest="x", **kw)
    pd.testing.assert_frame_equal(df, again)
    # another input digest invalidates the cache
    with pytest.raises(AssertionError, match="re-solved"):
        ablation.codesign_sweep(*args, inputs_digest="y", **kw)
    monkeypatch.undo()
    png, pdf = tmp_path / "c.png", tmp_path / "c.pdf"
    ablation.plot_codesign(df, png, pdf)
    first = (png.read_bytes(), pdf.read_bytes())
    ablation.plot_codesign(again, png, pdf)
    assert (png.read_bytes(), pdf.read_bytes()) == first
    md = ablation.codesign_markdown(df)
    assert "## 4 devices" in md and "Gain >= 1.05x" in md


def test_derive_cluster_h100_spineleaf():
    c = ablation.derive_cluster("h100_spineleaf", 1024, 50, 4)
    assert [lv.name for lv in c.levels] == ["node", "leaf", "spine"]
    assert c.levels[0].bytes_per_s == pytest.approx(450e9 * 0.82)
    assert c.levels[1].bytes_per_s == c.levels[2].bytes_per_s == pytest.approx(50e9)
    assert [lv.oversubscription for lv in c.levels] == [1.0, 1.0, 4.0]
    assert c.num_devices == 1024
    base = ablation.derive_cluster("h100_spineleaf", 128, 12.5, 2)
    from nest.spec.catalog import load_cluster

    ref = load_cluster("h100_spineleaf", 128)
    assert base.levels == ref.levels  # the catalog point of the sweep is the catalog cluster
    assert np.isclose(flattened(c).levels[2].bytes_per_s, flattened(base).levels[2].bytes_per_s)
