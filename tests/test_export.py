"""Plans as Megatron-LM arguments and rank placements (nest.export), checked by hand."""

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from nest.evaluate import evaluate, make_problem
from nest.export import layout_string, megatron_rank_coords, to_megatron
from nest.graph.layer_graph import Variant
from nest.plan_spec import load_plan
from nest.space import make_plan

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _flag(args, name):
    i = args.index(name)
    return args[i + 1]


def test_korthikanti_example_exports_megatrons_own_arguments():
    plan, pr = load_plan(EXAMPLES / "gpt3_175b_a100_selective_sp.yaml")
    exp = to_megatron(plan, pr)
    a = exp.args
    assert _flag(a, "--tensor-model-parallel-size") == "8"
    assert _flag(a, "--pipeline-model-parallel-size") == "8"
    assert "--sequence-parallel" in a and _flag(a, "--recompute-granularity") == "selective"
    assert _flag(a, "--global-batch-size") == "64" and _flag(a, "--micro-batch-size") == "1"
    assert (_flag(a, "--num-layers"), _flag(a, "--hidden-size"), _flag(a, "--seq-length")) == (
        "96", "12288", "2048")
    # Megatron's default split (12 blocks per stage, embedding first, head last): no layout
    assert "--pipeline-model-parallel-layout" not in a and "--use-tp-pp-dp-mapping" not in a
    assert exp.world_size == 64 and exp.identity_placement() and not exp.warnings
    assert exp.time_per_batch_s == evaluate(plan, pr).time_per_batch_s
    assert exp.command().startswith("torchrun --nnodes 8 --nproc-per-node 8")


def test_rank_orders_by_hand():
    """Megatron's default order tp-cp-ep-dp-pp (tp fastest) and --use-tp-pp-dp-mapping's
    tp-cp-ep-pp-dp: rank 5 of tp=2, dp=2, pp=2 is (tp 1, dp 0, pp 1) resp. (tp 1, pp 0, dp 1)."""
    k = megatron_rank_coords(5, 2, 1, 1, 2, 2, "tp-cp-ep-dp-pp")
    assert (k["tp"], k["dp"], k["pp"]) == (1, 0, 1)
    k = megatron_rank_coords(5, 2, 1, 1, 2, 2, "tp-cp-ep-pp-dp")
    assert (k["tp"], k["pp"], k["dp"]) == (1, 0, 1)
    pr = make_problem("tiny_gpt", "tiny_cluster", 8)
    L = pr.graph.num_layers
    for placement, stage0 in (("replica_major", {0, 1, 2, 3}), ("stage_major", {0, 1, 4, 5})):
        plan = make_plan(pr, "h", Variant(2), 2, 2, [(0, 2), (3, L - 1)], [0, 0],
                         ["none", "none"], placement)
        exp = to_megatron(plan, pr)
        assert {r["device"] for r in exp.rank_map if r["pp"] == 0} == stage0
        assert exp.identity_placement()
        assert ("--use-tp-pp-dp-mapping" in exp.args) == (placement == "stage_major")
        tp_groups = {frozenset(r["device"] for r in exp.rank_map
                               if (r["pp"], r["dp"]) == key)
                     for key in {(r["pp"], r["dp"]) for r in exp.rank_map}}
        assert tp_groups == {frozenset({0, 1}), frozenset({2, 3}), frozenset({4, 5}),
                             frozenset({6, 7})}


def test_uneven_cuts_become_a_layout_and_mixed_modes_are_projected():
    pr = make_problem("llama2_7b", "tpuv4_fattree", 64)
    plan = make_plan(pr, "h", Variant(), 3, 16, [(0, 9), (10, 20), (21, 33)], [1, 1, 0],
                     ["none", "selective", "full"], "replica_major")
    assert layout_string(plan, 34) == "Et*9|t*11|t*12L"  # blocks 1-9 | 10-20 | 21-32 + head
    exp = to_megatron(plan, pr)
    assert _flag(exp.args, "--pipeline-model-parallel-layout") == "Et*9|t*11|t*12L"
    assert _flag(exp.args, "--recompute-granularity") == "full"
    assert "--use-distributed-optimizer" in exp.args
    assert {s.recompute for s in exp.plan.stages} == {"full"}
    assert {s.zero_stage for s in exp.plan.stages} == {1}
    assert len(exp.warnings) == 3 and "exported vs" in exp.warnings[-1]
    assert exp.time_per_batch_s == evaluate(exp.plan, pr).time_per_batch_s
    assert exp.original_time_per_batch_s == evaluate(plan, pr).time_per_batch_s
    assert exp.world_size == 48  # 16 of the 64 devices stay idle, as in the plan


def test_moe_and_a_non_identity_placement(tmp_path):
    """A plan whose devices are permuted: the rank map pins every Megatron rank to the device
    with its coordinates; the CLI writes launch.sh, args.txt, rank_map.csv."""
    from nest.plan import Stage

    pr = make_problem("tiny_moe", "tiny_cluster", 8)
    L = pr.graph.num_layers
    plan = make_plan(pr, "h", Variant(1, False, 2), 2, 2, [(0, 2), (3, L - 1)], [0, 0],
                     ["none", "none"], "replica_major")
    swapped = plan.with_(stages=(Stage(0, 2, 4, (4, 5, 6, 7)), Stage(3, L - 1, 4, (0, 1, 2, 3))))
    exp = to_megatron(swapped, pr)
    assert _flag(exp.args, "--expert-model-parallel-size") == "2"
    assert _flag(exp.args, "--num-experts") == str(pr.model.num_experts)
    assert not exp.identity_placement()
    assert [r["device"] for r in exp.rank_map] == [4, 5, 6, 7, 0, 1, 2, 3]
    f = tmp_path / "plan.json"
    swapped.write(f)
    r = subprocess.run([sys.executable, "-m", "nest.cli", "export", str(f), "-o",
                        str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "not the identity" in r.stdout
    rows = list(csv.DictReader(open(tmp_path / "out" / "rank_map.csv")))
    assert [int(x["device"]) for x in rows] == [4, 5, 6, 7, 0, 1, 2, 3]
    assert (tmp_path / "out" / "launch.sh").read_text().count("--expert-model-parallel-size") == 1


@pytest.mark.parametrize("name", ["gpt3_175b_h100_nemo.yaml"])
def test_interleaved_example(name):
    plan, pr = load_plan(EXAMPLES / name)
    exp = to_megatron(plan, pr)
    assert _flag(exp.args, "--num-virtual-stages-per-pipeline-rank") == "6"
    assert "--pipeline-model-parallel-layout" not in exp.args  # 2 blocks per chunk: the default
    assert exp.world_size == 128 and exp.identity_placement()


def _hetero(problem, variants, zero=(0, 0), rec=("none", "none"), placement="replica_major"):
    L = problem.graph.num_layers
    return make_plan(problem, "h", variants[0], 2, 2, [(0, 2), (3, L - 1)], list(zero), list(rec),
                     placement, stage_variants=list(variants))


def _uniform_args(exp):
    """The one set of degrees the arguments name."""
    a = exp.args
    assert a.count("--tensor-model-parallel-size") == 1
    assert a.count("--context-parallel-size") <= 1 and a.count("--sequence-parallel") <= 1
    return (int(_flag(a, "--tensor-model-parallel-size")), "--sequence-parallel" in a,
            int(_flag(a, "--context-parallel-size")) if "--context-parallel-size" in a else 1)


@pytest.mark.parametrize("case", ["tp2_sp", "moe_tp2_cp2"])
def test_heterogeneous_stages_are_projected_to_one_variant(case, tmp_path):
    """Megatron-LM runs one tp / sp / ep / cp for the whole model: a heterogeneous plan exports
    as the fastest feasible uniform plan made of one of its own stage variants (same cuts, same
    dp x ep streams), re-scored by the shared evaluator, with both times in a warning."""
    from nest.export import uniform_candidates

    if case == "tp2_sp":
        pr = make_problem("tiny_gpt", "tiny_cluster", 8)
        plan = _hetero(pr, [Variant(tp=2), Variant(tp=2, sp=True)], zero=(0, 1),
                       rec=("none", "full"))
    else:
        pr = make_problem("tiny_moe", "tiny_cluster", 8).with_variants([Variant(tp=2)])
        plan = _hetero(pr, [Variant(tp=2), Variant(cp=2)], placement="stage_major")
    assert plan.heterogeneous
    exp = to_megatron(plan, pr)
    out = exp.plan
    assert not out.heterogeneous
    assert out.stage_variant(0) in {plan.stage_variant(j) for j in range(plan.pp)}
    assert _uniform_args(exp) == (out.tp, out.sp, out.cp)
    assert [(s.first_layer, s.last_layer) for s in out.stages] == [
        (s.first_layer, s.last_layer) for s in plan.stages]
    assert out.dp * out.ep == plan.dp * plan.ep and out.num_microbatches == plan.num_microbatches
    assert exp.world_size == len(exp.rank_map) <= plan.devices_used
    ev, orig = evaluate(out, pr), evaluate(plan, pr)
    assert ev.feasible and exp.time_per_batch_s == ev.time_per_batch_s
    assert exp.original_time_per_batch_s == orig.time_per_batch_s
    w = next(x for x in exp.warnings if "stages use variants" in x)
    assert f"{ev.time_per_batch_s:.4f} s" in w and f"{orig.time_per_batch_s:.4f} s planned" in w
    assert out.stage_variant(0).key in w
    assert "exported vs" in exp.warnings[-1]
    # the fastest of the candidates (those on regular placements launch as they are)
    best = min(evaluate(q, pr).time_per_batch_s for _, q in uniform_candidates(_fold(plan))
               if q.placement != "custom")
    assert exp.time_per_batch_s <= best
    if case == "tp2_sp":  # the per-stage knobs are projected as before
        assert {s.recompute for s in out.stages} == {"full"}
        assert {s.zero_stage for s in out.stages} == {1}
        assert "--use-distributed-optimizer" in exp.args
        f = tmp_path / "plan.json"  # the CLI prints the projection and writes it to launch.sh
        plan.write(f)
        r = subprocess.run([sys.executable, "-m", "nest.cli", "export", str(f), "-o",
                            str(tmp_path / "out")], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert "warning: stages use variants" in r.stderr
        assert f"predicted {exp.time_per_batch_s:.4f} s per batch" in r.stdout
        launch = (tmp_path / "out" / "launch.sh").read_text()
        assert "# warning: stages use variants" in launch
        assert launch.count("--tensor-model-parallel-size") == 1


def _fold(plan):
    from nest.export import _project

    return _project(plan, [])


def test_heterogeneous_widths_project_onto_fewer_devices():
    """A stage on fewer devices (tp 1 beside tp 2): a uniform tp 2 would need more devices than
    the plan uses, so the projection runs tp 1 on fewer devices and says why tp 2 was not."""
    from nest.plan import Stage

    pr = make_problem("tiny_gpt", "tiny_cluster", 8)
    L = pr.graph.num_layers
    base = make_plan(pr, "h", Variant(2), 2, 2, [(0, 2), (3, L - 1)], [0, 0], ["none", "none"],
                     "replica_major")
    plan = base.with_(stages=(base.stages[0], Stage(3, L - 1, 2, (4, 6), tp=1)))
    assert plan.heterogeneous and plan.devices_used == 6
    exp = to_megatron(plan, pr)
    assert _uniform_args(exp) == (1, False, 1) and exp.world_size == 4
    assert exp.time_per_batch_s == evaluate(exp.plan, pr).time_per_batch_s
    w = next(x for x in exp.warnings if "stages use variants" in x)
    assert "tp2_sp0_ep1_cp1 on every stage needs 8 devices, the plan uses 6" in w


def test_heterogeneous_plan_without_a_runnable_projection_is_a_plan_error(tmp_path):
    from nest.errors import PlanError

    pr = make_problem("tiny_gpt", "tiny_cluster", 8).with_hardware(hbm_bytes=1e6)
    plan = _hetero(pr, [Variant(tp=2), Variant(tp=2, sp=True)])
    with pytest.raises(PlanError, match=r"plan 'h' for tiny_gpt .*no uniform projection.*"
                                        r"out of memory"):
        to_megatron(plan, pr)
