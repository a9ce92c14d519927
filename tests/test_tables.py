"""The paper's tables, Figure 2 and the communication share (nest/experiments/tables.py) on tiny problems."""

import json
import math

import pandas as pd
import pytest

from nest.problem.evaluate import evaluate
from nest.graph.layer_graph import Variant
from nest.problem.plan import Plan, stages_from_cuts
from nest.problem.problem import make_problem
from nest.experiments.results import no_plan_record
from nest.spec.catalog import load_model
from nest.experiments.tables import (CATEGORIES, COMM_CATEGORIES, ablation_point, claims, comm_breakdown,
                         comm_table, reduced_problem, strategy_row, table2, table7,
                         term_category, write_csv)

PAPER_MODELS = {"llama2_7b", "llama3_70b", "bert_large", "gpt3_175b", "mixtral_8x7b"}
PAPER_PLANNERS = ["manual", "mcmc", "alpa_e", "phaze", "nest"]


# ---- breakdown categories ---------------------------------------------------------------------


def test_term_categories():
    assert term_category("stage3.compute_fwd") == "compute"
    assert term_category("stage0.recompute") == "recompute"
    assert term_category("stage12.tp_all_reduce.node") == "tp"
    assert term_category("stage1.recompute_tp_all_gather.leaf") == "tp"  # re-run collective
    assert term_category("stage1.ep_all_to_all.spine") == "ep"
    assert term_category("stage1.cp_reduce_scatter.node") == "cp"
    assert term_category("stage1.zero_reduce_scatter") == "zero"
    assert term_category("stage1.zero3_all_gather") == "zero"
    assert term_category("stage1.p2p_bwd") == "p2p"
    assert term_category("dp_sync.all_reduce.leaf") == "dp_sync"
    assert term_category("dp_sync.tied_embedding_all_reduce") == "dp_sync"
    assert term_category("pipeline_bubble") == "bubble"
    assert term_category("optimizer_step") == "optimizer"
    for bad in ("stage1.something_new", "mystery", "stagex.compute_fwd"):
        with pytest.raises(ValueError):
            term_category(bad)


def _hand_plan(problem):
    """tiny_gpt on 8 tiny-cluster devices: 2 stages x 2 replicas x tp 2, placed stage-major so
    the data-parallel pairs cross the rack level."""
    L = problem.graph.num_layers
    stages = stages_from_cuts([(0, 2), (3, L - 1)], 2, 2, 2, "stage_major", [0, 1],
                              ["none", "full"])
    m = problem.num_microbatches(2, 1)
    return Plan("hand", "tiny_gpt", "tiny_cluster", 8, 1, problem.training.global_batch, m,
                tp=2, pp=2, dp=2, ep=1, cp=1, sp=False, stages=stages, placement="stage_major")


def test_comm_share_of_a_hand_built_plan(small_batch):
    pr = make_problem("tiny_gpt", "tiny_cluster", 8, training=small_batch.with_(
        pipeline_time="paper", dp_overlap="none"))
    plan = _hand_plan(pr)
    ev = evaluate(plan, pr)
    assert ev.feasible, ev.reason
    # the time per batch computed independently of the breakdown: 1F1B in the paper's form
    m, p = plan.num_microbatches, plan.pp
    t_max = max(s.time_per_microbatch_s for s in ev.stages)
    T = (m + p - 1) * t_max + max(s.sync_s + s.optimizer_s for s in ev.stages)
    assert ev.time_per_batch_s == pytest.approx(T, rel=1e-12)
    # the communication terms by name: collectives of the tp group, pipeline sends, dp sync
    bd = ev.breakdown_s
    comm_keys = [k for k in bd if "tp_" in k or ".p2p_" in k or k.startswith("dp_sync.")
                 or ".zero" in k]
    assert any("tp_" in k for k in comm_keys) and any("p2p" in k for k in comm_keys)
    assert any(k.startswith("dp_sync.") for k in comm_keys)
    comm = sum(bd[k] for k in comm_keys)
    out = comm_breakdown(ev.to_dict())
    assert out["comm_s"] == pytest.approx(comm, rel=1e-12)
    assert out["comm_share"] == pytest.approx(comm / T, rel=1e-12)
    assert 0 < out["comm_share"] < 1
    # the categories add up to the time per batch
    assert sum(out[f"{c}_s"] for c in CATEGORIES) == pytest.approx(T, rel=1e-12)
    # critical path: the bubble's (p - 1) slots carry the bottleneck stage's communication mix
    stage = {k: x for k, x in bd.items() if k.startswith("stage")}
    st_comm = sum(x for k, x in stage.items() if k in comm_keys)
    crit = st_comm * (m + p - 1) / m + (comm - st_comm)
    assert out["comm_share_critical_path"] == pytest.approx(crit / T, rel=1e-9)
    # one row of the Figure 2 / section 5.3 table; the per-level split covers the communication
    df = comm_table([(plan.to_dict(), ev.to_dict())])
    r = df.iloc[0]
    assert r.status == "feasible" and (r.p, r.d, r.t, r.s) == (2, 2, 2, 1)
    assert sum(float(x.split(":")[1]) for x in r.comm_by_level.split(";")) == pytest.approx(
        sum(out[f"{c}_s"] for c in COMM_CATEGORIES), rel=1e-5)


def test_comm_table_no_plan_row():
    rec = no_plan_record("manual", "tiny_gpt", "tiny_cluster", 8, 1, "no feasible plan: x", 0.0)
    from nest.experiments.results import no_plan_evaluation

    df = comm_table([(rec, no_plan_evaluation(rec))])
    assert df.iloc[0].status == "no_plan" and math.isnan(df.iloc[0].comm_share)


# ---- Table 2 ----------------------------------------------------------------------------------

HAND_PLAN = {
    "schema": "nest.plan/v1", "planner": "nest", "model": "tiny_gpt", "cluster": "tiny_cluster",
    "num_devices": 8, "mbs": 1, "global_batch": 8, "num_microbatches": 2,
    "tp": 2, "pp": 2, "dp": 2, "ep": 1, "cp": 1, "sp": True,
    "placement": "tp-cp-ep-pp-dp", "schedule": "1f1b", "virtual_stages": 1,
    "predicted_time_per_batch_s": None, "solve_time_s": 0.5, "notes": "", "extra": {},
    "stages": [
        {"first_layer": 0, "last_layer": 3, "num_devices": 4, "device_ids": [0, 1, 4, 5],
         "zero_stage": 1, "recompute": "full"},
        {"first_layer": 4, "last_layer": 5, "num_devices": 4, "device_ids": [2, 3, 6, 7],
         "zero_stage": 1, "recompute": "none"},
    ],
}


def test_table2_row_reproduces_a_hand_written_plan(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(HAND_PLAN))
    Plan.read(path)  # a valid plan
    r = strategy_row(json.loads(path.read_text()))
    assert (r["p"], r["d"], r["t"], r["s"], r["e"], r["c"]) == (2, 2, 2, 2, 1, 1)
    assert r["devices_used"] == 8 and r["placement"] == "tp-cp-ep-pp-dp"
    assert r["layers"] == "4,2" and r["zero"] == "1*2" and r["zero_degree"] == "2*2"
    assert r["recompute"] == "full,none" and r["stage_variants"] == ""
    assert r["status"] == "feasible" and r["model"] == "tiny_gpt" and r["planner"] == "nest"
    # beside a paper column
    paper = {"models": {"tiny_gpt": {"expert_parallel": False,
                                     "strategies": {"nest": [2, 2, 2, 2], "manual": [4, 2, 1, 1]},
                                     "recomputation": "recomputation"}}}
    manual = dict(HAND_PLAN, planner="manual")
    df = table2([(HAND_PLAN, None), (manual, None)], paper)
    got = df.set_index("planner")
    assert got.loc["nest", "strategy"] == "{2, 2, 2, 2}"
    assert got.loc["nest", "paper_strategy"] == "{2, 2, 2, 2}"
    assert bool(got.loc["nest", "matches_paper"]) is True
    assert bool(got.loc["manual", "matches_paper"]) is False
    assert got.loc["nest", "paper_recomputation"] == "recomputation"
    # a no-plan record keeps its status and reason
    rec = no_plan_record("manual", "tiny_gpt", "tiny_cluster", 8, 1, "no feasible plan: y", 0.1)
    r = strategy_row(rec)
    assert r["status"] == "no_plan" and r["p"] is None and "y" in r["reason"]


def test_table2_csv_is_deterministic(tmp_path):
    df = table2([(HAND_PLAN, None)], {"models": {}})
    write_csv(df, tmp_path / "a.csv")
    write_csv(table2([(HAND_PLAN, None)], {"models": {}}), tmp_path / "b.csv")
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    assert b"\r" not in (tmp_path / "a.csv").read_bytes()


# ---- the paper's numbers (claims.yaml) --------------------------------------------------------


def test_claims_transcription_has_the_papers_models_and_planners():
    c = claims()
    t2 = c["table2"]
    assert set(t2["models"]) == PAPER_MODELS and t2["planners"] == PAPER_PLANNERS
    assert t2["num_devices"] == 512
    for name, m in t2["models"].items():
        load_model(name)  # a catalog model
        assert set(m["strategies"]) == set(PAPER_PLANNERS), name
        n = 6 if m["expert_parallel"] else 4
        for planner, s in m["strategies"].items():
            assert len(s) == n, (name, planner)
            if planner == "alpa_e":  # the paper gives only p
                assert s[0] > 0 and all(x is None for x in s[1:])
                continue
            devices = math.prod(s[:3]) * (s[4] * s[5] if n == 6 else 1)
            assert 480 <= devices <= 512, (name, planner, s)
    assert t2["models"]["gpt3_175b"]["strategies"]["nest"] == [16, 8, 4, 4]
    assert t2["models"]["mixtral_8x7b"]["strategies"]["nest"] == [8, 8, 1, 1, 4, 2]
    assert t2["models"]["bert_large"]["recomputation"] == "stashing"
    t6 = c["table6"]["models"]
    assert set(t6) == PAPER_MODELS - {"mixtral_8x7b"}
    assert t6["llama3_70b"] == {"alpa_executable_GB": 24.8, "nest_estimate_GB": 22.9}
    t7 = c["table7"]["models"]
    assert t7["llama3_70b"]["hbm_GB"] == 24 and t7["bert_large"]["hbm_GB"] == 0.12
    # the garbled "641 | 980" read as 1 + 80 x 8 and 10 x (2 + 24 x 4)
    assert t7["llama3_70b"]["devices_used"] == 1 + 80 * 8
    assert t7["bert_large"]["devices_used"] == 10 * (2 + 24 * 4)
    assert c["comm_share"]["share"] == {"h100_spineleaf": 0.10, "tpuv4_fattree": 0.01}


# ---- Table 7 (ZeRO ablation) on a tiny problem ------------------------------------------------


def test_zero_ablation_on_a_tiny_problem(small_batch):
    tr = small_batch
    pr = make_problem("tiny_llama", "tiny_cluster", 16, training=tr)
    # without ZeRO every device of a stage holds a whole copy of its layers' states; tiny_llama
    # has only tp 1, so any plan needs at least its largest layer's weights + grads + Adam
    v = Variant()
    per_param = tr.weight_bytes_per_param + tr.grad_bytes_per_param + tr.optimizer_state_bytes
    floor = max(la.costs[v.key].dense_params for la in pr.graph.layers) * per_param
    # with ZeRO-3 over all 16 devices (one stage, full recomputation) the peak is lower
    L = pr.graph.num_layers
    st = stages_from_cuts([(0, L - 1)], 1, 16, 1, "replica_major", [3], ["full"])
    plan = Plan("hand", "tiny_llama", "tiny_cluster", 16, 1, tr.global_batch,
                pr.num_microbatches(16, 1), 1, 1, 16, 1, 1, False, st)
    with_zero = evaluate(plan, pr).stages[0].peak_memory_bytes
    assert with_zero < floor
    hbm = (with_zero + floor) / 2
    red = reduced_problem("tiny_llama", "tiny_cluster", 16, hbm, framework_overhead=False,
                          training=tr)
    assert red.hardware.hbm_bytes == hbm and red.hardware.memory_overhead_bytes == 0
    yes = ablation_point(red, {}, variant="zero")
    no = ablation_point(red, {"space": {"zero_stages": [0]}}, variant="no_zero")
    assert yes["status"] == "feasible" and yes["time_per_batch_s"] > 0
    assert yes["max_peak_memory_bytes"] <= hbm
    assert any(s["zero_stage"] > 0 for s in yes["plan"]["stages"])
    assert no["status"] in ("no_plan", "infeasible") and not no["feasible"]
    assert no["plan"] is None or no["time_per_batch_s"] is None
    json.dumps(yes), json.dumps(no)  # the records are JSON
    df = table7([yes, no], {"models": {}})
    assert list(df.variant) == ["zero", "no_zero"] and list(df.feasible) == [True, False]
    assert isinstance(df, pd.DataFrame)
