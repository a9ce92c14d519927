"""nest.experiments.robustness: the verdicts rerun under a perturbed cost model. Checked against closed forms:
with compute and communication both x k every plan's time is x k (the objective is homogeneous),
so every gain is unchanged; the unperturbed row is the figures' own number (nest.reports.gains.gains);
a rescored plan keeps its plan and its time scales with the model."""

import math

import pandas as pd
import pytest

from nest.common.errors import SpecError
from nest.problem.evaluate import make_problem
from nest.experiments.run_point import plan_point
from nest.reports.gains import gains
from nest.experiments.results import collect_records
from nest.experiments.robustness import (COLUMNS, markdown, modes_of, parse_scale, perturbations,
                             point_record, rescore, summary, table)
from nest.spec.settings import CostScale, TrainingSettings

POINTS = [("tiny_gpt", 4), ("tiny_gpt", 8)]


def _problem(model, n, c=1.0, m=1.0):
    tr = TrainingSettings(global_batch=8, cost_scale=CostScale(c, m))
    return make_problem(model, "tiny_cluster", n, training=tr)


def _records(c, m, replan=("nest", "manual"), stored=None):
    rows = []
    for model, n in POINTS:
        pr = _problem(model, n, c, m)
        for planner in replan:
            plan, ev = plan_point(planner, pr, model, "tiny_cluster")
            rows.append({"planner": planner, "mode": "replanned", "plan": plan, "evaluation": ev})
        for planner, plans in (stored or {}).items():
            plan, ev = rescore(plans[(model, n)], pr)
            rows.append({"planner": planner, "mode": "rescored", "plan": plan, "evaluation": ev})
    return point_record(rows, c, m)["rows"]


@pytest.fixture(scope="module")
def base_rows():
    return _records(1.0, 1.0, ("nest", "manual", "phaze"))


def test_scale_names_read_back():
    for c, m in [(0.85, 1.3), (1.0, 0.7), (2.0, 1.15)]:
        assert parse_scale(f"c{c!r}_m{m!r}") == (c, m)
    with pytest.raises(SpecError, match="c<compute>_m<communication>"):
        parse_scale("c1_mx")


def test_perturbations_grid_and_bad_values():
    assert perturbations({"compute": [0.85, 1.0, 1.15], "communication": [1.0]}) == [
        (0.85, 1.0), (1.15, 1.0)]
    assert len(perturbations({"compute": [0.85, 1.15], "communication": [0.7, 1.3]})) == 4
    for bad in (0, -1.0, float("nan"), float("inf"), True):
        with pytest.raises(SpecError, match=r"robustness: key 'compute\.0'"):
            perturbations({"compute": [bad], "communication": [1.0]})


def test_ratio_extremes_are_the_corners_of_lowest_and_highest_ratio():
    """Brute force over the grid: the two kept pairs minimise and maximise m / c, and bound
    each factor alone (c with m = 1, m with c = 1)."""
    cfg = {"compute": [0.85, 1.15], "communication": [0.7, 1.3]}
    kept = perturbations({**cfg, "scenarios": "ratio_extremes"})
    assert kept == [(0.85, 1.3), (1.15, 0.7)]
    ratios = [m / c for c, m in perturbations(cfg)]
    assert len(ratios) == 4 and {min(ratios), max(ratios)} == {m / c for c, m in kept}
    alone = [1 / c for c in cfg["compute"]] + list(cfg["communication"])
    assert all(min(ratios) <= r <= max(ratios) for r in alone)
    with pytest.raises(SpecError, match="key 'scenarios'"):
        perturbations({**cfg, "scenarios": "corners"})


def test_homogeneous_perturbation_keeps_every_gain(base_rows):
    """Both factors x k: every plan is the same and every time is x k, so every gain (a ratio of
    times at the same batch) is the unperturbed one; the (1, 1) row is nest.reports.gains.gains."""
    base = collect_records([(r["evaluation"], r["plan"]) for r in base_rows])
    stored = {"phaze": {(r["plan"]["model"], r["plan"]["num_devices"]): r["plan"]
                        for r in base_rows if r["planner"] == "phaze"}}
    k = 1.3
    pts = {(k, k): _records(k, k, stored=stored)}
    cfg = {"compute": [k], "communication": [k]}
    res = table({"figures": {"fig": base}}, pts, {}, cfg)
    assert list(res.columns) == COLUMNS
    g = gains(base).set_index("planner")
    for r in res.itertuples():
        planner = r.quantity.removeprefix("gain_over:")
        assert r.points == g.loc[planner, "points_both_feasible"] == len(POINTS)
        assert math.isclose(r.value, g.loc[planner, "mean_gain"], rel_tol=1e-9), r
    assert modes_of(pts) == {"nest": {"replanned"}, "manual": {"replanned"},
                             "phaze": {"rescored"}}


def test_perturbed_gain_is_the_mean_of_time_ratios(base_rows):
    """A compute-only perturbation: the row is the mean over points of T(manual) / T(NEST),
    each re-planned and scored under the perturbed model."""
    base = collect_records([(r["evaluation"], r["plan"]) for r in base_rows])
    rows = _records(1.15, 1.0)
    res = table({"figures": {"fig": base}}, {(1.15, 1.0): rows}, {},
                {"compute": [1.15], "communication": [1.0]})
    t = {(r["planner"], r["plan"]["num_devices"]): r["evaluation"]["time_per_batch_s"]
         for r in rows}
    want = sum(t[("manual", n)] / t[("nest", n)] for _, n in POINTS) / len(POINTS)
    got = res[(res.quantity == "gain_over:manual") & (res.compute_scale == 1.15)]
    assert len(got) == 1 and math.isclose(got.value.iloc[0], want, rel_tol=1e-12)
    assert got.points.iloc[0] == len(POINTS)


def test_rescored_plan_time_scales_with_the_model(base_rows):
    r = next(r for r in base_rows if r["planner"] == "manual")
    model, n = r["plan"]["model"], r["plan"]["num_devices"]
    plan, ev = rescore(r["plan"], _problem(model, n, 0.85, 0.85))
    assert plan is r["plan"]
    assert math.isclose(ev["time_per_batch_s"], 0.85 * r["evaluation"]["time_per_batch_s"],
                        rel_tol=1e-9)


def test_summary_directions_and_markdown():
    res = pd.DataFrame([
        ("figure5", "gain_over:a", 1.0, 1.0, 1.2, 3), ("figure5", "gain_over:a", 0.85, 0.7, 1.1, 3),
        ("figure5", "gain_over:b", 1.0, 1.0, 1.05, 2), ("figure5", "gain_over:b", 1.15, 1.3, 0.97,
                                                         2),
        ("codesign", "codesign:n8_bw5_os2", 1.0, 1.0, float("nan"), 0),
        ("codesign", "codesign:n8_bw5_os2", 0.85, 0.7, float("nan"), 0)], columns=COLUMNS)
    s = summary(res).set_index("quantity")
    assert s.loc["gain_over:a", "same_direction"] is True
    assert s.loc["gain_over:b", "same_direction"] is False
    assert s.loc["gain_over:b", "min_at"] == (1.15, 1.3)
    assert s.loc["codesign:n8_bw5_os2", "same_direction"] is None
    md = markdown(res, {}, {"compute": [0.85, 1.15], "communication": [0.7, 1.3]})
    assert "1 of 2 quantities (1 without a point" in md
    assert "Changed: figure5 gain_over:b." in md
    assert "| figure5 | gain_over:b | 1.0500x | 0.9700x | 1.0500x | (1.15, 1.3) | 2 | better | no |" \
        in md


def test_batch_adjusted_replay_is_rescored_on_the_batch_it_processes():
    """A replayed plan whose mbs x dp does not divide the global batch is scored on the batch it
    processes (baselines.manual.on_processed_batch); rescoring it under a perturbed model keeps
    that batch (it raised a num_microbatches mismatch on the default run) and scales its time."""
    def problem(k):
        tr = TrainingSettings(global_batch=9, cost_scale=CostScale(k, k))
        return make_problem("tiny_gpt", "tiny_cluster", 8, training=tr)

    plan, ev = plan_point("manual", problem(1.0), "tiny_gpt", "tiny_cluster")
    assert plan["global_batch"] < 9 and plan["extra"]["batch_configured"] == 9, plan
    same, ev2 = rescore(plan, problem(0.85))
    assert same is plan and ev2["global_batch"] == plan["global_batch"]
    assert math.isclose(ev2["time_per_batch_s"], 0.85 * ev["time_per_batch_s"], rel_tol=1e-9)
