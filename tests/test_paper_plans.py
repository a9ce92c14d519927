"""The paper's own baseline plans (baselines/paper_plans.py) replayed from the artifact's table.

Expected values come from reading the CSV here with the csv module (not through the planner's
reader) and from counting layers in the plans' stages."""

import csv
import hashlib
from collections import Counter
from pathlib import Path

import pytest

from baselines import paper_plans
from nest.common.errors import SpecError
from nest.problem.evaluate import make_problem
from nest.planners.registry import NoPlan, NotApplicable, run_planner
from nest.spec.settings import TrainingSettings
from nest.spec.catalog import config_dir

CSV = config_dir() / "paper" / "artifact_baseline_plans.csv"
# sha256 of the CSV's data lines (header row and rows, '\n'-joined, comments left out) as
# transcribed from the artifact's baseline_configs_*.py files and checked against them row by row
# (docs/artifact.md, "Transcription check"): an edit to any stored plan fails here
DATA_SHA256 = "0bc04611941add3862017c5f8bab6f89021dcbeb46b606db2064e0ca5f9dfaf5"
DOI = "10.5281/zenodo.18826203"  # the paper's appendix A.2
HEADER = "cluster,mbs,model,num_devices,planner,pp,dp,tp,layer_partition"
EP = {"mixtral_8x7b": 4}  # docs/paper.md, Manual configurations: Mixtral's ep=4 on top of p*d*t


def csv_rows(path=CSV):
    lines = [ln for ln in Path(path).read_text().splitlines() if not ln.startswith("#")]
    return list(csv.DictReader(lines))


def csv_row(cluster, mbs, model, n, planner):
    (row,) = [r for r in csv_rows() if (r["cluster"], int(r["mbs"]), r["model"],
                                        int(r["num_devices"]), r["planner"])
              == (cluster, mbs, model, n, planner)]
    return row


def blocks_per_stage(plan, num_blocks):
    """Transformer blocks (layers 1..num_blocks) on each stage."""
    return [sum(1 <= i <= num_blocks for i in range(s.first_layer, s.last_layer + 1))
            for s in plan.stages]


def tiny_table(tmp_path, *rows):
    path = tmp_path / "plans.csv"
    path.write_text("# test table\n" + HEADER + "\n" + "\n".join(rows) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def tiny():
    return make_problem("tiny_llama", "tiny_cluster", 8, training=TrainingSettings(global_batch=8))


def test_table_is_the_papers_verbatim_and_complete():
    text = CSV.read_text()
    data = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert hashlib.sha256("\n".join(data).encode()).hexdigest() == DATA_SHA256
    comments = " ".join(ln for ln in text.splitlines() if ln.startswith("#"))
    assert DOI in comments and "docs/artifact.md" in comments
    rows = csv_rows()
    counts = Counter(r["planner"] for r in rows)
    assert counts == {"manual": 53, "mcmc": 46, "phaze": 49}
    assert Counter(r["planner"] for r in paper_plans.read_table()) == counts
    assert len(rows) == len(paper_plans.read_table())


def test_manual_llama2_7b_64_replays_the_row():
    row = csv_row("tpuv4_fattree", 1, "llama2_7b", 64, "manual")
    out = run_planner("paper_manual", make_problem("llama2_7b", "tpuv4_fattree", 64))
    p = out.plan
    assert out.status == "feasible"
    assert (p.pp, p.dp, p.tp, p.ep) == (int(row["pp"]), int(row["dp"]), int(row["tp"]), 1)
    assert p.devices_used == int(row["pp"]) * int(row["dp"]) * int(row["tp"]) == 64
    assert p.placement == "replica_major" and all(s.zero_stage == 0 for s in p.stages)
    # Megatron's even split of 32 blocks; embedding first, head last
    assert blocks_per_stage(p, 32) == [4] * 8
    assert p.stages[0].first_layer == 0 and p.stages[-1].last_layer == 33
    assert p.num_microbatches == 4096 // (1 * 8)
    assert "artifact_baseline_plans.csv line" in p.notes and "idle" not in p.notes


def test_layer_partition_gives_those_stage_sizes():
    row = csv_row("tpuv4_fattree", 2, "llama2_7b", 256, "mcmc")
    assert row["layer_partition"] == "1x28,2,2"
    out = run_planner("paper_mcmc", make_problem("llama2_7b", "tpuv4_fattree", 256, mbs=2))
    p = out.plan
    assert p.pp == 30 and blocks_per_stage(p, 32) == [1] * 28 + [2, 2]
    assert p.stages[0].first_layer == 0 and p.stages[-1].last_layer == 33
    assert p.devices_used == 30 * 8 and "16 of 256 devices idle" in p.notes


def test_uneven_split_first_stages_take_the_extra_block():
    out = run_planner("paper_phaze", make_problem("llama2_7b", "tpuv4_fattree", 64))
    p = out.plan
    assert (p.pp, p.dp, p.tp) == (6, 10, 1)
    assert blocks_per_stage(p, 32) == [6, 6, 5, 5, 5, 5]  # 32 = 2*6 + 4*5
    assert p.devices_used == 60 and "4 of 64 devices idle" in p.notes


def test_absent_point_is_not_applicable():
    assert not [r for r in csv_rows() if (r["model"], r["num_devices"], r["mbs"])
                == ("llama2_7b", "64", "2")]
    out = run_planner("paper_manual", make_problem("llama2_7b", "tpuv4_fattree", 64, mbs=2))
    assert out.status == "not_applicable" and out.plan is None
    assert "stores no manual plan for llama2_7b on 64 tpuv4_fattree devices at micro-batch 2" \
        in out.reason


def test_oversize_row_is_no_plan():
    over = [r for r in csv_rows() if r["planner"] == "manual" and r["cluster"] == "tpuv4_fattree"
            and int(r["pp"]) * int(r["dp"]) * int(r["tp"]) * EP.get(r["model"], 1)
            > int(r["num_devices"])]
    r = next(r for r in over if r["model"] == "gpt3_175b")
    need = int(r["pp"]) * int(r["dp"]) * int(r["tp"])
    out = run_planner("paper_manual", make_problem(r["model"], r["cluster"],
                                                   int(r["num_devices"]), int(r["mbs"])))
    assert out.status == "no_plan" and f"needs {need} devices of {r['num_devices']}" in out.reason


def test_mixtral_uses_ep4_on_top():
    row = csv_row("tpuv4_fattree", 1, "mixtral_8x7b", 256, "manual")
    p, d, t = int(row["pp"]), int(row["dp"]), int(row["tp"])
    out = run_planner("paper_manual", make_problem("mixtral_8x7b", "tpuv4_fattree", 256))
    plan = out.plan
    assert (plan.pp, plan.dp, plan.tp, plan.ep) == (p, d, t, 4)
    assert all(s.num_devices == d * t * 4 for s in plan.stages)
    assert plan.devices_used == p * d * t * 4 == 256
    assert plan.num_microbatches == 4096 // (d * 4)


def test_more_stages_than_blocks_puts_the_embedding_alone(tmp_path, tiny):
    # tiny_llama has 4 blocks: 5 stages = embedding alone, then one block each (head on the last)
    table = tiny_table(tmp_path, "tiny_cluster,1,tiny_llama,8,manual,5,1,1,")
    p = paper_plans.plan(tiny, {"baseline": "manual", "table": table})
    assert blocks_per_stage(p, 4) == [0, 1, 1, 1, 1]
    assert [(s.first_layer, s.last_layer) for s in p.stages][::4] == [(0, 0), (4, 5)]
    table = tiny_table(tmp_path, "tiny_cluster,1,tiny_llama,8,manual,7,1,1,")
    with pytest.raises(NoPlan, match="pp=7 exceeds"):
        paper_plans.plan(tiny, {"baseline": "manual", "table": table})


def test_bad_partition_names_file_line_and_count(tmp_path, tiny):
    table = tiny_table(tmp_path, "tiny_cluster,1,tiny_llama,8,manual,2,2,1,\"1x2,1\"")
    with pytest.raises(SpecError, match=r"plans.csv: line 3: key 'layer_partition'.*"
                                        r"3 stages of 3 blocks, expected pp=2 stages of "
                                        r"tiny_llama's 4 blocks"):
        paper_plans.plan(tiny, {"baseline": "manual", "table": table})
    table = tiny_table(tmp_path, "tiny_cluster,1,tiny_llama,8,manual,2,2,1,\"3,1\"")
    p = paper_plans.plan(tiny, {"baseline": "manual", "table": table})
    assert blocks_per_stage(p, 4) == [3, 1]


def test_undeclared_variant_is_not_applicable(tmp_path, tiny):
    table = tiny_table(tmp_path, "tiny_cluster,1,tiny_llama,8,phaze,2,2,2,")
    with pytest.raises(NotApplicable, match="tp2_sp0_ep1_cp1"):
        paper_plans.plan(tiny, {"baseline": "phaze", "table": table})


def test_plan_that_never_fits_is_returned_and_scored_infeasible(tmp_path, tiny):
    table = tiny_table(tmp_path, "tiny_cluster,1,tiny_llama,8,manual,2,2,1,")
    small = tiny.with_hardware(hbm_bytes=1e3)
    out = run_planner("paper_manual", small, {"table": table})
    assert out.status == "infeasible" and out.plan.stages[0].recompute == "full"
    assert "does not fit even with full recomputation" in out.plan.notes
    fits = run_planner("paper_manual", tiny, {"table": table})
    assert fits.status == "feasible" and fits.plan.stages[0].recompute == "none"


def test_settings_are_checked():
    pr = make_problem("tiny_llama", "tiny_cluster", 8)
    with pytest.raises(SpecError, match=r"config/planners.yaml.*'paper_<baseline>.settings."
                                        r"baseline'"):
        paper_plans.plan(pr, {"baseline": "alpa"})
    with pytest.raises(SpecError, match=r"config/planners.yaml.*settings.seed'.*unknown"):
        paper_plans.plan(pr, {"baseline": "manual", "seed": 1})


@pytest.mark.parametrize("model,cluster,n", [("llama3_70b", "tpuv4_fattree", 256),
                                             ("mixtral_8x7b", "h100_spineleaf", 128)])
def test_artifact_manual_rows_agree_with_the_manual_baseline(model, cluster, n):
    # config/paper/manual_configs.yaml was transcribed separately from this CSV (docs/paper.md,
    # Manual configurations)
    pr = make_problem(model, cluster, n)
    a, b = run_planner("manual", pr), run_planner("paper_manual", pr)
    # Llama-3-70B's 80/3/1 does not split the global batch of 4096: both score it on the 4095
    # samples it processes (baselines.manual.on_processed_batch)
    assert a.plan.global_batch == b.plan.global_batch == 4096 // (a.plan.dp * a.plan.ep) * (
        a.plan.dp * a.plan.ep)
    assert a.plan.stages == b.plan.stages
    assert a.evaluation.time_per_batch_s == b.evaluation.time_per_batch_s


# -- batch divisibility: a different experiment, not "out of memory" ----------------------------
def test_processed_batch_closed_form():
    from baselines.manual import processed_batch

    for gb in (1, 7, 4096, 4100):
        for split in (1, 3, 6, 7, 68, 4096, 5000):
            done = processed_batch(gb, split)
            assert done % split == 0 and 0 <= gb - done < split  # the largest multiple <= gb
    assert processed_batch(4096, 6) == 4092 and processed_batch(4096, 68) == 4080


@pytest.fixture(scope="module")
def llama3_512():
    from nest.spec.settings import load_training

    return make_problem("llama3_70b", "tpuv4_fattree", 512,
                        training=load_training().with_(global_batch=4096))


@pytest.mark.parametrize("planner", ["paper_mcmc", "paper_manual", "manual"])
def test_plan_80_6_is_scored_on_the_batch_it_processes(planner, llama3_512):
    """The artifact's (and Manual's) Llama-3-70B 80/6/1 at 512 devices: mbs x dp = 6 does not
    divide 4096. It is scored on the 4092 samples (682 micro-batches) it processes, its
    throughput counts those samples, and the results row says so; it is never `memory`."""
    from nest.experiments.run_point import plan_point
    from nest.experiments.results import collect_records

    plan, ev = plan_point(planner, llama3_512, "llama3_70b", "tpuv4_fattree")
    assert (plan["pp"], plan["dp"], plan["tp"]) == (80, 6, 1)
    assert plan["global_batch"] == 4092 and plan["num_microbatches"] == 682
    assert plan["extra"]["batch_configured"] == 4096
    assert ev["feasible"] and ev["global_batch"] == 4092
    assert ev["throughput_samples_per_s"] == pytest.approx(4092 / ev["time_per_batch_s"],
                                                           rel=1e-12)
    assert max(s["peak_memory_bytes"] for s in ev["stages"]) <= (
        llama3_512.cluster.hardware.hbm_bytes)
    row = collect_records([(ev, plan)]).iloc[0]
    assert row.status == "feasible" and row.reason_class == "fits"
    assert row.batch_processed == 4092 and bool(row.batch_adjusted)


def test_batch_that_one_step_exceeds_is_no_plan_of_class_batch(tmp_path, tiny, monkeypatch):
    """mbs x dp x ep above the global batch: nothing to round down to; the reason class is
    batch, read from the planner (NoPlan.kind), not from its message."""
    from nest.experiments.run_point import plan_point
    from nest.experiments.results import collect_records

    table = tiny_table(tmp_path, "tiny_cluster,1,tiny_llama,8,manual,1,8,1,")
    small = tiny.with_training(global_batch=4)
    out = run_planner("paper_manual", small, {"table": table})
    assert out.status == "no_plan" and out.kind == "batch"
    assert "exceeds the global batch 4" in out.reason
    from nest.planners import registry as planners

    monkeypatch.setattr(planners, "planner_entry", lambda name: (
        "baselines.paper_plans:plan", {"baseline": "manual", "table": table}))
    plan, ev = plan_point("paper_manual", small, "tiny_llama", "tiny_cluster")
    assert plan["reason_class"] == "batch"
    assert collect_records([(ev, plan)]).iloc[0].reason_class == "batch"


def test_reason_class_of_an_evaluator_rejected_plan():
    """A plan the evaluator rejects only for the batch split is `batch`; with a stage out of
    memory it is `memory` (nest.experiments.results.reason_class)."""
    from nest.experiments.results import reason_class

    plan = {"mbs": 1, "dp": 6, "ep": 1}
    ev = {"global_batch": 4096}
    why = "global batch 4096 is not a multiple of mbs x dp x ep = 6: ..."
    assert reason_class("infeasible", why, ev, plan) == "batch"
    assert reason_class("infeasible", why + "; out of memory: stage 0 needs", ev, plan) == (
        "memory")
    assert reason_class("infeasible", "out of memory: stage 3", {"global_batch": 4092}, plan) == (
        "memory")
    assert reason_class("no_plan", "Manual 8/8/8 (ep=1) needs 512 devices > 128") == "devices"
    assert reason_class("no_plan", "anything", None, {"reason_class": "memory"}) == "memory"
    assert reason_class("no_plan", "the search space holds no variant") == "none_found"
    # the baselines' own messages (baselines/alpa_e.py, mcmc.py; nest.solver)
    assert reason_class("no_plan", "num_microbatches=3 must split global_batch=8 into whole "
                        "mbs=1 slices over a divisor of 8 devices") == "batch"
    assert reason_class("no_plan", "no chain found a plan that fits in memory (20 proposals)"
                        ) == "memory"
    assert reason_class("no_plan", "the search space is empty: every variant needs more than "
                        "the 4 devices or more replicas than the batch has") == "devices"
    assert reason_class("no_plan", "no plan fits in 0.03 GB per device even with ZeRO-3") == (
        "memory")
    assert reason_class("crashed", "planner crashed: ValueError") == "crash"
