"""Plans as Megatron-LM arguments and rank placements (nest.interfaces.export), checked by hand."""

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from nest.problem.evaluate import evaluate, make_problem
from nest.interfaces.export import layout_string, megatron_rank_coords, to_megatron
from nest.graph.layer_graph import Variant
from nest.problem.plan_spec import load_plan
from nest.problem.space import make_plan

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _cli_export(capsys, *argv):
    """`nest export argv` in-process: (exit code, stdout, stderr)."""
    from nest.interfaces import cli

    rc = cli.main(["export", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


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
    assert "torchrun --nnodes 8 --nproc-per-node 8 " in exp.command()
    assert exp.env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}  # tp > 1 on Ampere: asserted
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in exp.command()


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


def test_moe_and_a_non_identity_placement(tmp_path, capsys):
    """A plan whose devices are permuted: the rank map pins every Megatron rank to the device
    with its coordinates; the CLI writes launch.sh, args.txt, rank_map.csv."""
    from nest.problem.plan import Stage

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
    rc, out, err = _cli_export(capsys, f, "-o", tmp_path / "out")
    assert rc == 0, err
    assert "not the identity" in out
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
def test_heterogeneous_stages_are_projected_to_one_variant(case, tmp_path, capsys):
    """Megatron-LM runs one tp / sp / ep / cp for the whole model: a heterogeneous plan exports
    as the fastest feasible uniform plan made of one of its own stage variants (same cuts, same
    dp x ep streams), re-scored by the shared evaluator, with both times in a warning."""
    from nest.interfaces.export import uniform_candidates

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
        rc, out, err = _cli_export(capsys, f, "-o", tmp_path / "out")
        assert rc == 0, err
        assert "warning: stages use variants" in err
        assert f"predicted {exp.time_per_batch_s:.4f} s per batch" in out
        launch = (tmp_path / "out" / "launch.sh").read_text()
        assert "# warning: stages use variants" in launch
        assert launch.count("--tensor-model-parallel-size") == 1


def _fold(plan):
    from nest.interfaces.export import _project

    return _project(plan, [])


def test_heterogeneous_widths_project_onto_fewer_devices():
    """A stage on fewer devices (tp 1 beside tp 2): a uniform tp 2 would need more devices than
    the plan uses, so the projection runs tp 1 on fewer devices and says why tp 2 was not."""
    from nest.problem.plan import Stage

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
    from nest.common.errors import PlanError

    pr = make_problem("tiny_gpt", "tiny_cluster", 8).with_hardware(hbm_bytes=1e6)
    plan = _hetero(pr, [Variant(tp=2), Variant(tp=2, sp=True)])
    # one line of at most MAX_MESSAGE characters: the head names the plan and the reason
    with pytest.raises(PlanError, match=r"plan 'h' for tiny_gpt .*no uniform projection"):
        to_megatron(plan, pr)


# ---------------------------------------------------------------------------------------------
# Megatron-LM's own rules (megatron/training/arguments.py validate_args, read at d98e8a64) and
# megatron-core's RankGenerator (the `megatron-core` package, dev extra)
# ---------------------------------------------------------------------------------------------

def _plan_in(order, tp, cp, ep, dp, pp):
    """A bare uniform plan laid out in `order` (rank = device id under that order)."""
    from nest.problem.placement import stage_device_ids
    from nest.problem.plan import Plan, Stage

    ids = stage_device_ids(pp, dp, tp, cp, ep, order)
    stages = tuple(Stage(j, j, dp * tp * cp * ep, ids[j]) for j in range(pp))
    return Plan("t", "m", "c", pp * dp * tp * cp * ep, 1, dp * ep, 1, tp, pp, dp, ep, cp, False,
                stages, placement=order)


def _core_groups(order, tp, cp, ep, dp, pp):
    """The groups megatron-core's initialize_model_parallel builds, from its own RankGenerator:
    the dense generator (ep 1, dp = world / (tp cp pp)) and the expert one on the separate
    (expert-tp = tp, ep, expert-dp = world / (tp ep pp), pp) grid with cp 1, same order."""
    ps = pytest.importorskip("megatron.core.parallel_state")
    world = tp * cp * ep * dp * pp
    dense = ps.RankGenerator(tp=tp, ep=1, dp=world // (tp * cp * pp), pp=pp, cp=cp, order=order)
    expert = ps.RankGenerator(tp=tp, ep=ep, dp=world // (tp * ep * pp), pp=pp, cp=1, order=order)
    out = {k: dense.get_ranks(t) for k, t in (("tp", "tp"), ("cp", "cp"), ("dp", "dp"),
                                               ("dp_cp", "dp-cp"), ("pp", "pp"))}
    out.update({k: expert.get_ranks(t) for k, t in (("ep", "ep"), ("expert_tp", "tp"),
                                                      ("expert_dp", "dp"))})
    return out


DEGREES = [(tp, cp, ep, dp, pp) for tp in (1, 2) for cp in (1, 2) for ep in (1, 2, 4)
           for dp in (1, 2) for pp in (1, 2, 3)]


@pytest.mark.parametrize("cli_order", ["tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"])
def test_rank_maps_agree_with_megatron_cores_rank_generator(cli_order):
    """For every order the exporter launches with (Megatron-LM's two CLI orders) and every plan
    order the launcher expresses, over tp, cp, ep, dp, pp grids: the groups megatron-core's own
    RankGenerator builds, mapped through the export's rank map, are the groups the harness
    prices; with cp > 1 and ep > 1 they never are (expert grid folds ep over cp), which is why
    the export projects such plans (test_placement_orders)."""
    from nest.interfaces.export import _rank_map
    from nest.problem.placement import expressible, harness_groups, launcher_orders

    cases = 0
    for tp, cp, ep, dp, pp in DEGREES:
        if not (cli_order.endswith("pp") or pp == 1 or cp == ep):
            continue  # initialize_model_parallel asserts this itself
        if not expressible(tp, cp, ep, dp, pp, cli_order):
            assert cp > 1 and ep > 1
            plan = _plan_in(cli_order, tp, cp, ep, dp, pp)
            ours = harness_groups([s.device_ids for s in plan.stages], tp, cp, ep, dp)
            assert _core_groups(cli_order, tp, cp, ep, dp, pp)["ep"] != [sorted(g) for g in
                                                                       ours["ep"]]
            assert {frozenset(g) for g in _core_groups(cli_order, tp, cp, ep, dp, pp)["ep"]} \
                != ours["ep"]
            continue
        core = _core_groups(cli_order, tp, cp, ep, dp, pp)
        for plan_order in launcher_orders(tp, cp, ep, dp, pp):
            plan = _plan_in(plan_order, tp, cp, ep, dp, pp)
            rmap = _rank_map(plan, cli_order, 8)
            dev = {r["rank"]: r["device"] for r in rmap}
            ours = harness_groups([s.device_ids for s in plan.stages], tp, cp, ep, dp)
            for kind, groups in core.items():
                assert {frozenset(dev[r] for r in g) for g in groups} == ours[kind], (
                    kind, plan_order, (tp, cp, ep, dp, pp))
            cases += 1
    assert cases > 50


def test_nest_placement_megatron_groups_is_megatron_cores():
    """nest.problem.placement.megatron_groups (what check_against_plan compares) == RankGenerator's, for
    every order initialize_model_parallel accepts."""
    from nest.problem.placement import all_orders, megatron_groups

    n = 0
    for tp, cp, ep, dp, pp in DEGREES[::3]:
        for order in all_orders():
            if not (order.endswith("pp") or pp == 1 or cp == ep):
                continue
            core = _core_groups(order, tp, cp, ep, dp, pp)
            ours = megatron_groups(tp, cp, ep, dp, pp, order)
            for kind, groups in core.items():
                assert {frozenset(g) for g in groups} == ours[kind], (kind, order)
            n += 1
    assert n > 500


@pytest.mark.parametrize("tp,cp,ep", [(1, 2, 2), (2, 2, 2), (1, 2, 4)])
def test_exported_rank_map_with_ep_and_cp_is_megatron_cores(tp, cp, ep):
    """End to end, ep > 1 and cp > 1 on 8-GPU nodes: the export projects onto a plan Megatron-LM
    runs, and megatron-core's RankGenerator groups for its order, through its rank map, are
    exactly the exported plan's priced groups."""
    from nest.problem.placement import harness_groups

    pr = make_problem("tiny_moe", "dgx_a100", 16)
    L = pr.graph.num_layers
    plan = make_plan(pr, "h", Variant(tp, False, ep, cp), 1, 16 // (tp * cp * ep), [(0, L - 1)],
                     [0], ["none"], "replica_major")
    exp = to_megatron(plan, pr)
    out = exp.plan
    assert out.cp == 1 or out.ep == 1
    assert any("expert-dp, pp) grid" in w for w in exp.warnings)
    dev = {r["rank"]: r["device"] for r in exp.rank_map}
    ours = harness_groups([s.device_ids for s in out.stages[:out.pp]], out.tp, out.cp, out.ep,
                          out.dp)
    for kind, groups in _core_groups(exp.order, out.tp, out.cp, out.ep, out.dp, out.pp).items():
        assert {frozenset(dev[r] for r in g) for g in groups} == ours[kind], kind


def test_zero3_exports_megatron_fsdp_with_its_checkpoint_format_and_environment():
    pr = make_problem("tiny_gpt", "tiny_cluster", 8)
    L = pr.graph.num_layers
    plan = make_plan(pr, "h", Variant(2), 2, 2, [(0, 2), (3, L - 1)], [3, 3], ["none", "none"],
                     "replica_major")
    exp = to_megatron(plan, pr)
    a = exp.args
    assert "--use-custom-fsdp" not in a and "--use-megatron-fsdp" in a
    assert _flag(a, "--data-parallel-sharding-strategy") == "optim_grads_params"
    assert _flag(a, "--ckpt-format") == "fsdp_dtensor"  # Megatron-FSDP asserts it
    assert exp.env == {}  # FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS != 1 ...
    assert "unset CUDA_DEVICE_MAX_CONNECTIONS" in exp.command()  # ... so the launch clears it
    z2 = to_megatron(plan.with_(stages=tuple(s.__class__(**{**s.__dict__, "zero_stage": 2})
                                             for s in plan.stages)), pr)
    assert _flag(z2.args, "--data-parallel-sharding-strategy") == "optim_grads"


def test_the_priced_overlap_is_exported_as_megatrons_flags():
    """dp_overlap bucketed -> --overlap-grad-reduce with the priced bucket; param_gather_overlap
    -> --overlap-param-gather (Megatron-LM's validate_args asserts --overlap-grad-reduce and a
    sharded optimizer beside it); tp_comm_overlap with sequence parallelism -> --tp-comm-overlap
    (asserted to come with --sequence-parallel). Defaults: none of them."""
    from nest.spec.settings import TrainingSettings

    def export(**kw):
        tr = TrainingSettings(global_batch=16, **kw)
        pr = make_problem("tiny_gpt", "tiny_cluster", 8, training=tr)
        L = pr.graph.num_layers
        plan = make_plan(pr, "h", Variant(2, True), 2, 2, [(0, 2), (3, L - 1)], [1, 1],
                         ["none", "none"], "replica_major")
        return to_megatron(plan, pr)

    flags = ("--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap",
             "--ddp-bucket-size")
    plain = export()
    assert not any(f in plain.args for f in flags)
    full = export(dp_overlap="bucketed", param_gather_overlap=True, tp_comm_overlap=True,
                  dp_bucket_params=20_000)
    assert all(f in full.args for f in flags) and not full.warnings
    assert _flag(full.args, "--ddp-bucket-size") == "20000"
    alone = export(param_gather_overlap=True)
    assert "--overlap-param-gather" not in alone.args
    assert any("--overlap-grad-reduce" in w for w in alone.warnings)
    # a userbuffers config other than Transformer Engine's default is priced, not exported
    recipe = export(tp_comm_overlap=True, tp_overlap_rs="ring_exchange", tp_overlap_bulk_sms=0)
    assert "--tp-comm-overlap" in recipe.args
    assert any("tp_overlap_rs" in w and "tp_overlap_bulk_sms" in w
               and "--tp-comm-overlap-cfg" in w for w in recipe.warnings)


def test_uneven_interleaving_emits_the_layout_alone_and_indivisible_layers_get_a_layout():
    """Megatron rejects --num-virtual-stages-per-pipeline-rank beside a layout, and a split
    without a layout when pp x v does not divide the blocks."""
    from nest.interfaces.export import _pipeline_args
    from nest.problem.plan_spec import block_cuts

    pr = make_problem("tiny_gpt", "tiny_cluster", 8)  # 4 blocks
    L = pr.graph.num_layers
    base = make_plan(pr, "h", Variant(), 2, 1, [(0, 2), (3, L - 1)], [0] * 2, ["none"] * 2,
                     "replica_major")

    def chunks(cuts):
        from nest.problem.plan import Stage

        return base.with_(schedule="interleaved", virtual_stages=2, stages=tuple(
            Stage(a, b, 1, base.stages[j % 2].device_ids) for j, (a, b) in enumerate(cuts)))

    assert _pipeline_args(chunks([(0, 1), (2, 2), (3, 3), (4, L - 1)]), L - 2, L) == [
        "--num-virtual-stages-per-pipeline-rank", "2"]
    assert _pipeline_args(chunks([(0, 2), (3, 3), (4, 4), (5, L - 1)]), L - 2, L) == [
        "--pipeline-model-parallel-layout", "Et*2|t|t|L"]
    # 4 blocks on 3 stages: block_cuts' split (2, 1, 1) is not Megatron's default (it rejects 4/3)
    three = make_plan(pr, "h", Variant(), 3, 1, block_cuts(4, 3), [0] * 3, ["none"] * 3,
                      "replica_major")
    assert _pipeline_args(three, L - 2, L) == ["--pipeline-model-parallel-layout",
                                               "Et*2|t|tL"]


def test_launch_starts_exactly_the_plans_ranks():
    """3 ranks on 2-GPU nodes: two torchrun agents of 2 and 1 processes (never 4)."""
    from nest.interfaces.export_launch import node_runs, torchrun_script

    rmap = [{"rank": r, "node": r // 2, "local_rank": r % 2, "device": r} for r in range(3)]
    assert [len(x) for _, x in node_runs(rmap)] == [2, 1]
    text = torchrun_script(["--a", "1"], "pretrain_gpt.py", {}, rmap, 2)
    assert "NPROC=(2 1)" in text and "--nnodes 2 --nproc-per-node ${NPROC[$NODE_RANK]}" in text
    assert "CUDA_VISIBLE_DEVICES" not in text
    swapped = [dict(r, local_rank=1 - r["local_rank"]) if r["node"] == 0 else r for r in rmap]
    assert 'VISIBLE=("1,0" "0")' in torchrun_script([], "x.py", {}, swapped, 2)


def test_63_ranks_on_8_gpu_nodes_are_63_processes():
    pr = make_problem("llama2_7b", "dgx_a100", 64)
    from nest.problem.plan_spec import block_cuts

    plan = make_plan(pr, "h", Variant(), 7, 9, block_cuts(32, 7), [1] * 7, ["full"] * 7,
                     "replica_major")
    exp = to_megatron(plan, pr)
    assert exp.world_size == 63 and exp.num_agents == 8
    c = exp.command()
    assert "NPROC=(8 8 8 8 8 8 8 7)" in c and "--nnodes 8 " in c
    assert "--pipeline-model-parallel-layout" in exp.args  # 32 blocks on 7 stages
    assert "--num-virtual-stages-per-pipeline-rank" not in exp.args
    assert "#SBATCH --nodes=8" in exp.slurm()


@pytest.mark.parametrize("model,rope,eps", [("llama3_70b", "500000", "1e-05"),
                                            ("mixtral_8x7b", "1000000", "1e-05"),
                                            ("tiny_llama", "10000", "1e-05")])
def test_numerics_changing_model_arguments_come_from_the_spec(model, rope, eps):
    from nest.interfaces.export import _model_args
    from nest.spec.catalog import load_model

    m = load_model(model)
    a = _model_args(m, [])
    assert _flag(a, "--rotary-base") == rope and _flag(a, "--norm-epsilon") == eps
    assert _flag(a, "--position-embedding-type") == "rope" and _flag(a, "--normalization") == \
        "RMSNorm"
    assert "--swiglu" in a and "--disable-bias-linear" in a
    assert "--untie-embeddings-and-output-weights" in a
    if m.num_kv_heads != m.num_heads:
        assert _flag(a, "--num-query-groups") == str(m.num_kv_heads)


def test_bert_runs_megatrons_examples_bert_entry_point():
    pr = make_problem("bert_large", "dgx_a100", 8)
    L = pr.graph.num_layers
    plan = make_plan(pr, "h", Variant(), 1, 8, [(0, L - 1)], [0], ["none"], "replica_major")
    exp = to_megatron(plan, pr)
    assert exp.script == "examples/bert/pretrain_bert.py"
    assert _flag(exp.args, "--norm-epsilon") == "1e-12"
    assert _flag(exp.args, "--position-embedding-type") == "learned_absolute"
    assert "--bert-no-binary-head" in exp.args and exp.env == {}


@pytest.mark.skipif(not __import__("os").environ.get("MEGATRON_LM"),
                    reason="MEGATRON_LM (a Megatron-LM checkout) not set")
def test_examples_pass_megatron_lms_own_validation():
    """scripts/check_megatron_args.py on examples/: Megatron-LM's parse_args, validate_args and
    TransformerConfig (needs a checkout in MEGATRON_LM and triton importable)."""
    import os

    r = subprocess.run([sys.executable, "scripts/check_megatron_args.py", "--megatron-lm",
                        os.environ["MEGATRON_LM"], *map(str, sorted(EXAMPLES.glob("*.yaml")))],
                       capture_output=True, text=True, cwd=EXAMPLES.parent)
    assert r.returncode == 0, r.stdout + r.stderr


def test_hosts_come_from_the_node_definition_not_the_first_network_level():
    """GB200 NVL72: the NVLink domain (first level) is 72 GPUs, a host (compute tray) 4: 144
    GPUs launch as 36 torchrun agents of 4 processes, never 2 of 72."""
    from nest.problem.plan_spec import block_cuts

    pr = make_problem("llama2_7b", "gb200_nvl72", 144)
    assert pr.cluster.levels[0].devices_per_group == 72 and pr.cluster.node_size == 4
    plan = make_plan(pr, "h", Variant(tp=8, sp=True), 2, 9, block_cuts(32, 2), [1, 1],
                     ["none", "none"], "replica_major")
    exp = to_megatron(plan, pr)
    assert exp.world_size == 144 and exp.num_agents == 36
    assert "--nnodes 36 --nproc-per-node 4 " in exp.command()
    assert "#SBATCH --nodes=36" in exp.slurm()
    # a rail-optimised network's own devices_per_node; a level file's first level
    assert make_problem("llama2_7b", "dgx_h100_rail_superpod", 64).cluster.node_size == 8
    assert make_problem("llama2_7b", "h100_spineleaf", 128).cluster.node_size == 8


def test_a_scale_up_cluster_without_hosts_says_what_the_export_assumed(tmp_path):
    """A cluster file whose first level is a 72-GPU NVLink domain and that states no
    devices_per_node launches hosts of 72 (the only size it gives), and the export says so and
    names the key; the shipped file (trays of 4) exports without that warning."""
    import yaml

    from nest.problem.plan_spec import block_cuts
    from nest.spec.catalog import config_dir, read_yaml

    d = read_yaml(config_dir() / "clusters" / "gb200_nvl72.yaml")
    d.pop("devices_per_node")
    path = tmp_path / "nvl72_no_hosts.yaml"
    path.write_text(yaml.safe_dump(d))
    for cluster, warned in ((str(path), True), ("gb200_nvl72", False)):
        pr = make_problem("llama2_7b", cluster, 144)
        plan = make_plan(pr, "h", Variant(tp=8, sp=True), 2, 9, block_cuts(32, 2), [1, 1],
                         ["none", "none"], "replica_major")
        exp = to_megatron(plan, pr)
        said = [w for w in exp.warnings if "devices_per_node" in w]
        assert bool(said) == warned, exp.warnings
        assert exp.num_agents == (2 if warned else 36)
        if warned:
            assert "72 devices each" in said[0] and "'devices_per_node'" in said[0]


def test_a_torus_without_hosts_says_what_the_export_assumed():
    """A torus's first level is two chips on one link (the TPU v4 torus: hop-1 pairs), not a
    host; with no devices_per_node the export launched 32 agents of 2 for 64 chips without a
    word. It now says so and names the key, as for a scale-up domain."""
    from nest.problem.plan_spec import block_cuts

    pr = make_problem("llama2_7b", "tpuv4_torus", 64)
    assert pr.cluster.network == "torus" and pr.cluster.node_size == 2
    plan = make_plan(pr, "h", Variant(tp=2), 2, 16, block_cuts(32, 2), [1, 1],
                     ["none", "none"], "replica_major")
    exp = to_megatron(plan, pr)
    said = [w for w in exp.warnings if "devices_per_node" in w]
    assert said and "2 devices each" in said[0], exp.warnings


def test_a_node_size_that_does_not_divide_the_cluster_is_refused(tmp_path):
    from nest.common.errors import SpecError
    from nest.spec.catalog import cluster_from_dict, config_dir, read_yaml

    d = read_yaml(config_dir() / "clusters" / "gb200_nvl72.yaml")
    with pytest.raises(SpecError, match="devices_per_node.*5 must divide"):
        cluster_from_dict({**d, "devices_per_node": 5}, "x.yaml", 144)


# ---- current families (issue 25): the model as it is, in Megatron-LM's own flags ---------------

_TINY_DSV3 = dict(model_type="deepseek_v3", hidden_size=64, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=4, intermediate_size=128,
                  moe_intermediate_size=32, n_routed_experts=4, n_shared_experts=1,
                  num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=32,
                  q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                  num_nextn_predict_layers=1, vocab_size=1000, max_position_embeddings=512,
                  tie_word_embeddings=False)


def _export_tiny(tmp_path, cfg, variant, pp, dp, cuts=None):
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    pr = make_problem(str(path), "dgx_h100_superpod", variant.width * pp * dp, seq_len=128,
                      variants=[variant])
    L = pr.graph.num_layers
    cuts = cuts or [(0, L // 2 - 1), (L // 2, L - 1)][:pp] if pp > 1 else [(0, L - 1)]
    plan = make_plan(pr, "h", variant, pp, dp, cuts, [0] * pp, ["none"] * pp, "replica_major")
    return pr, to_megatron(plan, pr)


def test_deepseek_v3_exports_mla_dense_layers_and_mtp(tmp_path):
    pr, exp = _export_tiny(tmp_path, _TINY_DSV3, Variant(tp=2, sp=True, ep=2), 2, 1,
                           cuts=[(0, 1), (2, 5)])  # uneven: a layout, with the MTP module
    a = exp.args
    assert "--multi-latent-attention" in a
    assert [_flag(a, f) for f in ("--kv-lora-rank", "--q-lora-rank", "--qk-head-dim",
                                  "--qk-pos-emb-head-dim", "--v-head-dim")] == \
        ["32", "24", "16", "8", "16"]
    assert _flag(a, "--ffn-hidden-size") == "128" and _flag(a, "--moe-ffn-hidden-size") == "32"
    assert _flag(a, "--moe-layer-freq") == "([0]*1+[1]*3)"
    assert _flag(a, "--moe-shared-expert-intermediate-size") == "32"
    assert _flag(a, "--mtp-num-layers") == "1" and "--moe-grouped-gemm" in a
    assert _flag(a, "--pipeline-model-parallel-layout") == "Et|t*3mL"
    assert not [w for w in exp.warnings if "not expressed" in w]


def test_mla_exports_the_latent_norms(tmp_path):
    """DeepSeek's MLA normalises its compressed latents (transformers' kv_a_layernorm and, with a
    Q LoRA rank, q_a_layernorm: 2 x (32 + 24) of the counted parameters here); megatron-core's
    MLA spec builds them only with --qk-layernorm (else IdentityOp), so an export without it
    trains a model without those norms. DeepSeek-V2-Lite (no Q LoRA rank) keeps the KV norm."""
    _, exp = _export_tiny(tmp_path, _TINY_DSV3, Variant(ep=2), 1, 4)
    assert exp.args.count("--qk-layernorm") == 1
    lite = {**_TINY_DSV3, "q_lora_rank": None, "model_type": "deepseek_v2",
            "num_nextn_predict_layers": None}
    _, exp = _export_tiny(tmp_path, lite, Variant(ep=2), 1, 4)
    assert exp.args.count("--qk-layernorm") == 1 and "--q-lora-rank" not in exp.args


def test_qwen2_moe_gated_shared_expert_exports_megatrons_gate(tmp_path):
    """Qwen2-MoE gates its shared expert by sigmoid(x w), w of 1 x hidden (transformers'
    Qwen2MoeSparseMoeBlock.shared_expert_gate); megatron-core's SharedExpertMLP(gate=True) computes
    the same (TransformerConfig.moe_shared_expert_gate, megatron-core 0.20.0): exported as
    --moe-shared-expert-gate, no longer a warning to add it by hand."""
    cfg = dict(model_type="qwen2_moe", hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, intermediate_size=128, vocab_size=1000,
               max_position_embeddings=512, num_experts=4, num_experts_per_tok=2,
               moe_intermediate_size=32, shared_expert_intermediate_size=64)
    _, exp = _export_tiny(tmp_path, cfg, Variant(ep=2), 1, 8)
    assert _flag(exp.args, "--moe-shared-expert-intermediate-size") == "64"
    assert "--moe-shared-expert-gate" in exp.args
    assert not [w for w in exp.warnings if "shared expert" in w]


def test_windowed_families_export_megatrons_window_pattern(tmp_path):
    gemma3 = dict(model_type="gemma3_text", hidden_size=64, num_hidden_layers=6,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  intermediate_size=128, vocab_size=1000, max_position_embeddings=512,
                  sliding_window=32, sliding_window_pattern=3)
    _, exp = _export_tiny(tmp_path, gemma3, Variant(), 1, 8)
    # Megatron-LM's list: 1 = sliding window (is_layer_window_attention); blocks 3 and 6 global
    assert _flag(exp.args, "--window-size") == "(31,0)"
    assert _flag(exp.args, "--window-attn-skip-freq") == "([1]*2+[0]*1+[1]*2+[0]*1)"
    assert "--qk-layernorm" in exp.args


def test_gpt_oss_exports_sinks_and_biases(tmp_path):
    cfg = dict(model_type="gpt_oss", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=32, intermediate_size=64, num_local_experts=4,
               num_experts_per_tok=2, vocab_size=1000, max_position_embeddings=512,
               sliding_window=32, attention_bias=True)
    _, exp = _export_tiny(tmp_path, cfg, Variant(tp=2, ep=2), 1, 2)
    a = exp.args
    assert _flag(a, "--softmax-type") == "learnable" and "--disable-bias-linear" not in a
    assert _flag(a, "--expert-tensor-parallel-size") == "1"
    assert any("--expert-tensor-parallel-size 1" in w for w in exp.warnings)


def test_every_example_names_its_model_and_cluster_from_any_folder(tmp_path, monkeypatch):
    """A plan file's relative model / cluster path is read against the file's own folder
    (docs/planning.md: `nest evaluate examples/...` works from any folder): four examples named
    `examples/models/...`, which resolved only from the repository root ('file not found' from
    /tmp or from examples/)."""
    from nest.problem.plan_spec import resolve_relative
    from nest.spec.catalog import read_yaml

    monkeypatch.chdir(tmp_path)
    for f in sorted(EXAMPLES.glob("*.yaml")):
        d = read_yaml(f)
        for key in ("model", "cluster"):
            ref = resolve_relative(d[key], f.parent)
            if ref.endswith((".yaml", ".yml", ".json")) or "/" in ref:
                assert Path(ref).is_file(), (f.name, key, d[key])


def test_router_numerics_are_exported(tmp_path):
    """The router as transformers computes it, in megatron-core's arguments (moe_utils.
    topk_routing_with_score_function): DeepSeek-V3 selects on sigmoid scores plus a per-expert
    bias in the best 4 of 8 groups and scales by 2.5 (its published config.json; Megatron-
    Bridge's DeepSeek-V3 bridge sets the same); Qwen2-MoE and DeepSeek-V2 take the top k of a
    softmax over every expert without renormalising (norm_topk_prob false:
    --moe-router-pre-softmax); Mixtral's softmax over the top-k logits is Megatron's default.
    Exports had said none of it, so every one trained Mixtral's router."""
    v3 = {**_TINY_DSV3, "n_routed_experts": 8, "n_group": 4, "topk_group": 2,
          "routed_scaling_factor": 2.5, "norm_topk_prob": True, "scoring_func": "sigmoid",
          "topk_method": "noaux_tc"}
    _, exp = _export_tiny(tmp_path, v3, Variant(ep=2), 1, 4)
    a = exp.args
    assert _flag(a, "--moe-router-score-function") == "sigmoid"
    assert "--moe-router-enable-expert-bias" in a and "--moe-router-pre-softmax" not in a
    assert [_flag(a, f) for f in ("--moe-router-topk-scaling-factor", "--moe-router-num-groups",
                                  "--moe-router-group-topk")] == ["2.5", "4", "2"]
    v2 = {**_TINY_DSV3, "model_type": "deepseek_v2", "num_nextn_predict_layers": None,
          "norm_topk_prob": False, "topk_method": "greedy", "scoring_func": "softmax"}
    _, exp = _export_tiny(tmp_path, v2, Variant(ep=2), 1, 4)
    assert "--moe-router-pre-softmax" in exp.args
    assert "--moe-router-score-function" not in exp.args
    assert "--moe-router-topk-scaling-factor" not in exp.args
    mixtral = dict(model_type="mixtral", hidden_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                   vocab_size=1000, max_position_embeddings=512, num_local_experts=4,
                   num_experts_per_tok=2)
    _, exp = _export_tiny(tmp_path, mixtral, Variant(ep=2), 1, 4)
    assert not [f for f in exp.args if f.startswith("--moe-router-") and f not in (
        "--moe-router-topk", "--moe-router-load-balancing-type")]


def test_balancing_loss_is_the_configs(tmp_path):
    """The load-balancing loss and its coefficient as the config states them, as Megatron-Bridge
    maps a Hugging Face config (model_bridge.CONFIG_MAPPING: router_aux_loss_coef / aux_loss_alpha
    -> moe_aux_loss_coeff; its DeepSeek-V2 / V3 bridges: seq_aux_loss; its gpt-oss bridge: no
    balancing loss). Every MoE export had said aux_loss at 1e-2: DeepSeek-V2's 0.003 per-sequence
    loss, Mixtral-8x7B's 0.02, Qwen3-MoE's 0.001 were all lost. A model YAML that states none
    keeps Megatron-LM's recommended aux_loss at 1e-2."""
    mixtral = dict(model_type="mixtral", hidden_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                   vocab_size=1000, max_position_embeddings=512, num_local_experts=4,
                   num_experts_per_tok=2)

    def balance(cfg):
        _, exp = _export_tiny(tmp_path, cfg, Variant(ep=2), 1, 4)
        a = exp.args
        return _flag(a, "--moe-router-load-balancing-type"), (
            _flag(a, "--moe-aux-loss-coeff") if "--moe-aux-loss-coeff" in a else None)

    assert balance({**mixtral, "router_aux_loss_coef": 0.02}) == ("aux_loss", "0.02")
    assert balance(mixtral) == ("aux_loss", "0.001")  # MixtralConfig's default
    v2 = {**_TINY_DSV3, "model_type": "deepseek_v2", "num_nextn_predict_layers": None,
          "norm_topk_prob": False, "topk_method": "greedy", "scoring_func": "softmax",
          "aux_loss_alpha": 0.003, "seq_aux": True}
    assert balance(v2) == ("seq_aux_loss", "0.003")
    assert balance({**v2, "seq_aux": False}) == ("aux_loss", "0.003")
    v3 = {**_TINY_DSV3, "aux_loss_alpha": 0.0001, "seq_aux": True}
    assert balance(v3) == ("seq_aux_loss", "0.0001")
    from nest.common.errors import SpecError
    from nest.graph.hf_spec import model_spec_from_hf_config

    for key, bad in (("aux_loss_alpha", "abc"), ("aux_loss_alpha", -1), ("seq_aux", "yes")):
        with pytest.raises(SpecError, match=f"key '{key}'"):  # was an internal error (exit 4)
            model_spec_from_hf_config({**v3, key: bad}, seq_len=128)
    pr = make_problem("tiny_moe", "tiny_cluster", 4)
    L = pr.graph.num_layers
    plan = make_plan(pr, "h", Variant(1, False, 2), 1, 2, [(0, L - 1)], [0], ["none"],
                     "replica_major")
    exp = to_megatron(plan, pr)
    assert (_flag(exp.args, "--moe-router-load-balancing-type"),
            _flag(exp.args, "--moe-aux-loss-coeff")) == ("aux_loss", "1e-2")


def test_top1_moe_exports_a_router_megatron_accepts(tmp_path):
    """Top-1 routing with the softmax after the choice gives every token a weight of 1 and the
    router no gradient; megatron-core refuses it ("Please use --moe-router-pre-softmax when
    topk is 1"), so such an export failed Megatron-LM's own checks. It is exported with
    --moe-router-pre-softmax and a warning saying what changes."""
    mixtral = dict(model_type="mixtral", hidden_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                   vocab_size=1000, max_position_embeddings=512, num_local_experts=4,
                   num_experts_per_tok=1)
    _, exp = _export_tiny(tmp_path, mixtral, Variant(ep=2), 1, 4)
    assert exp.args.count("--moe-router-pre-softmax") == 1
    assert [w for w in exp.warnings if "Switch Transformer" in w]
    _, exp = _export_tiny(tmp_path, dict(mixtral, num_experts_per_tok=2), Variant(ep=2), 1, 4)
    assert "--moe-router-pre-softmax" not in exp.args


def test_mla_yarn_is_exported(tmp_path):
    """DeepSeek's YaRN (factor 40, mscale / mscale_all_dim) under multi-latent attention: the
    export states --rope-type yarn, --rotary-scaling-factor, --mscale and --mscale-all-dim
    (megatron-core's MLATransformerConfig otherwise trains with the arguments' defaults 1 / 1 / 0:
    checked with scripts/check_megatron_args.py's TransformerConfig at Megatron-LM d98e8a64); an
    original length or beta other than MLATransformerConfig's fixed 4096 / 32 / 1 stays a
    warning."""
    yarn = {"type": "yarn", "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
            "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}
    cfg = {**_TINY_DSV3, "rope_scaling": yarn}
    _, exp = _export_tiny(tmp_path, cfg, Variant(ep=2), 1, 4)
    assert [_flag(exp.args, f) for f in ("--rope-type", "--rotary-scaling-factor", "--mscale",
                                         "--mscale-all-dim")] == ["yarn", "40.0", "0.707", "0.707"]
    assert not [w for w in exp.warnings if "RoPE scaling" in w]
    cfg = {**_TINY_DSV3, "rope_scaling": {**yarn, "original_max_position_embeddings": 8192}}
    _, exp = _export_tiny(tmp_path, cfg, Variant(ep=2), 1, 4)
    assert "--rope-type" not in exp.args and [w for w in exp.warnings if "RoPE scaling" in w]


def test_yarn_on_ordinary_attention_is_exported(tmp_path):
    """gpt-oss's YaRN (its published config: factor 32, original 4096, betas 32 / 1, truncate
    false) as Megatron-LM's yarn position embedding, the values Megatron-Bridge's gpt-oss bridge
    sets (checked with Megatron-LM d98e8a64's TransformerConfig: yarn_rotary_scaling_factor 32,
    yarn_correction_range_round_to_int False); the export had only warned and trained plain
    RoPE. A YaRN key Megatron-LM has no argument for stays a warning."""
    yarn = {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
            "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
    cfg = dict(model_type="gpt_oss", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=32, intermediate_size=64, num_local_experts=4,
               num_experts_per_tok=2, vocab_size=1000, max_position_embeddings=512,
               sliding_window=32, attention_bias=True, rope_scaling=yarn)
    _, exp = _export_tiny(tmp_path, cfg, Variant(ep=2), 1, 4)
    a = exp.args
    assert a.count("--position-embedding-type") == 1
    assert [_flag(a, f) for f in ("--position-embedding-type", "--rotary-scaling-factor",
                                  "--yarn-original-max-position-embeddings", "--yarn-beta-fast",
                                  "--yarn-beta-slow")] == ["yarn", "32.0", "4096", "32.0", "1.0"]
    assert "--no-yarn-correction-range-round-to-int" in a and "--mscale" not in a
    assert not [w for w in exp.warnings if "RoPE scaling" in w]
    rounded = dict(cfg, rope_scaling={k: v for k, v in yarn.items() if k != "truncate"})
    _, exp = _export_tiny(tmp_path, rounded, Variant(ep=2), 1, 4)
    assert "--no-yarn-correction-range-round-to-int" not in exp.args
    other = dict(cfg, rope_scaling={**yarn, "attention_factor": 1.2})
    _, exp = _export_tiny(tmp_path, other, Variant(ep=2), 1, 4)
    assert _flag(exp.args, "--position-embedding-type") == "rope"
    assert [w for w in exp.warnings if "RoPE scaling" in w]


def test_rank_map_names_graph_nodes_and_torus_chips(tmp_path):
    """A graph cluster file lists its devices in any order; the reduction numbers them group by
    group (here g0, g2 share switch s0 but are listed first and third), so the rank map's device
    ids were not the file's order and nothing said which node each is. rank_map.csv now names
    the graph node (and a torus chip's coordinate) beside the id."""
    import json

    import yaml

    nodes = [{"id": "s0", "kind": "switch"}, {"id": "s1", "kind": "switch"},
             {"id": "top", "kind": "switch"}] + [{"id": f"g{i}", "kind": "device"}
                                                 for i in (0, 1, 2, 3)]
    links = [{"source": f"g{i}", "target": f"s{i % 2}", "bandwidth": 1e11, "latency": 1e-6}
             for i in range(4)]
    links += [{"source": f"s{j}", "target": "top", "bandwidth": 1e10, "latency": 5e-6}
              for j in (0, 1)]
    (tmp_path / "g.json").write_text(json.dumps({"directed": False, "multigraph": False,
                                                 "graph": {}, "nodes": nodes, "links": links}))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(
        {"name": "g4", "hardware": "tiny_accel", "source": "t", "devices_per_node": 2,
         "network": {"kind": "graph", "file": "g.json"}}))
    pr = make_problem("tiny_gpt", str(tmp_path / "c.yaml"), 4)
    assert pr.cluster.device_names == ("g0", "g2", "g1", "g3")
    plan = make_plan(pr, "h", Variant(tp=2), 1, 2, [(0, pr.graph.num_layers - 1)], [0],
                     ["none"], "replica_major")
    rows = list(csv.DictReader(to_megatron(plan, pr).files()["rank_map.csv"].splitlines()))
    by_node: dict = {}
    for r in rows:
        by_node.setdefault(r["node"], set()).add(r["device_name"])
    assert sorted(by_node.values(), key=sorted) == [{"g0", "g2"}, {"g1", "g3"}]
    torus = make_problem("llama2_7b", "tpuv4_torus", 64).cluster.device_names
    assert torus[:3] == ("0,0,0", "1,0,0", "0,1,0") and len(set(torus)) == 4096
    assert make_problem("tiny_gpt", "tiny_cluster", 4).cluster.device_names == ()


def test_interleaved_pp2_with_blocking_sends_exports_overlapped_sends():
    """Megatron-LM's validate_args asserts pp > 2 for an interleaved schedule without
    --overlap-p2p-communication; a plan priced with blocking sends (the default) at pp 2 is
    exported with overlapped sends (no --no-overlap-p2p-communication), re-scored under
    overlap_p2p_comm, with both times in a warning (pp > 2 keeps the blocking flag:
    tests/test_p2p_overlap.py)."""
    from nest.problem.plan import Stage
    from nest.spec.settings import TrainingSettings

    pr = make_problem("tiny_gpt", "tiny_cluster", 4, training=TrainingSettings(global_batch=8))
    L = pr.graph.num_layers  # 4 blocks

    def interleaved(p, cuts):
        base = make_plan(pr, "h", Variant(), p, 1, cuts[:p], [0] * p, ["none"] * p,
                         "replica_major")
        return base.with_(schedule="interleaved", virtual_stages=len(cuts) // p, stages=tuple(
            Stage(a, b, 1, base.stages[j % p].device_ids) for j, (a, b) in enumerate(cuts)))

    two = interleaved(2, [(0, 1), (2, 2), (3, 3), (4, L - 1)])
    exp = to_megatron(two, pr)
    assert "--no-overlap-p2p-communication" not in exp.args
    over = evaluate(two, pr.with_training(overlap_p2p_comm=True)).time_per_batch_s
    assert exp.time_per_batch_s == pytest.approx(over, rel=1e-12)
    assert any("pp 2 only with overlapped" in w and f"{over:.4f}" in w
               and f"{evaluate(two, pr).time_per_batch_s:.4f}" in w for w in exp.warnings)


def test_context_parallelism_over_windows_exports_a_ring_te_runs(tmp_path):
    """Transformer Engine refuses a sliding window under cp_comm_type p2p (Megatron-LM's default
    ring) and a learnable softmax under anything but a2a (context_parallel.py,
    attn_forward_func_with_cp). Windowed layers with cp > 1 export --cp-comm-type all_gather,
    the form priced (the K/V all-gather); gpt-oss's sinks a2a with a warning; a window of at
    least the sequence is full attention: no --window-size (nor a cp comm type) at all."""
    mistral = dict(model_type="mistral", hidden_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                   vocab_size=1000, max_position_embeddings=512, sliding_window=32)
    _, exp = _export_tiny(tmp_path, mistral, Variant(cp=2), 1, 2)
    assert _flag(exp.args, "--cp-comm-type") == "all_gather"
    assert _flag(exp.args, "--window-size") == "(31,0)"
    _, exp = _export_tiny(tmp_path, mistral, Variant(), 1, 2)
    assert "--cp-comm-type" not in exp.args  # no cp: Megatron-LM's default stays
    wide = {**mistral, "sliding_window": 128}  # = seq_len: every key is in the window
    _, exp = _export_tiny(tmp_path, wide, Variant(cp=2), 1, 2)
    assert "--window-size" not in exp.args and "--cp-comm-type" not in exp.args
    oss = dict(model_type="gpt_oss", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=32, intermediate_size=64, num_local_experts=4,
               num_experts_per_tok=2, vocab_size=1000, max_position_embeddings=512,
               sliding_window=32, attention_bias=True)
    _, exp = _export_tiny(tmp_path, oss, Variant(cp=2), 1, 2)
    assert _flag(exp.args, "--cp-comm-type") == "a2a"
    assert any("a2a" in w and "sinks" in w for w in exp.warnings)


def test_context_parallelism_priced_unfused_exports_a_fused_kernel():
    """Transformer Engine has no unfused attention kernel under context parallelism (it disables
    UnfusedDotProductAttention there; Megatron-LM's own core asserts cp 1): a cp 2 plan priced
    with the unfused core (the A100 / V100 default) is exported with --attention-backend auto,
    re-scored with flash attention, both times in a warning; cp 1 keeps the unfused backend."""
    from nest.spec.settings import TrainingSettings

    tr = TrainingSettings(global_batch=8, attention="unfused")
    pr = make_problem("tiny_moe", "tiny_cluster", 8, training=tr)
    L = pr.graph.num_layers
    plan = make_plan(pr, "h", Variant(cp=2), 2, 2, [(0, L // 2 - 1), (L // 2, L - 1)], [1, 1],
                     ["none", "none"], "replica_major")
    exp = to_megatron(plan, pr)
    assert _flag(exp.args, "--attention-backend") == "auto"
    flash = evaluate(plan, pr.with_training(attention="flash")).time_per_batch_s
    assert exp.time_per_batch_s == pytest.approx(flash, rel=1e-12)
    assert flash != evaluate(plan, pr).time_per_batch_s
    assert any("context parallelism only with a fused" in w and f"{flash:.4f}" in w
               for w in exp.warnings)
    one = make_plan(pr, "h", Variant(), 2, 4, [(0, L // 2 - 1), (L // 2, L - 1)], [1, 1],
                    ["none", "none"], "replica_major")
    assert _flag(to_megatron(one, pr).args, "--attention-backend") == "unfused"


def test_slurm_job_name_is_the_models_name_and_device_count(tmp_path):
    """A model given by path (a Hugging Face hub snapshot folder, a config.json) names the job by
    the model's name (ModelSpec.name), not by its path: the path gave 'nest-_tmp_..._snapshots',
    cut at 64 characters before the device count."""
    import shutil

    from nest.spec.catalog import config_dir, load_model

    deep = tmp_path / ("x" * 60) / "models--org--tiny" / "snapshots" / "0e9e39f"
    deep.mkdir(parents=True)
    model = deep / "tiny_gpt.yaml"
    shutil.copy(config_dir() / "models" / "tiny_gpt.yaml", model)
    spec = tmp_path / "p.yaml"
    spec.write_text(f"model: {model}\ncluster: tiny_cluster\nnum_devices: 8\nglobal_batch: 64\n"
                    "pp: 2\ndp: 2\ntp: 2\n")
    plan, problem = load_plan(spec)
    exp = to_megatron(plan, problem)
    name = next(ln for ln in exp.slurm().split("\n") if ln.startswith("#SBATCH --job-name="))
    assert name == f"#SBATCH --job-name=nest-{load_model(model).name}-8", name
