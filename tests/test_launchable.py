"""nest plan's launchable space (nest.solver.launchable): exact against scoring every plan of the
space with the shared evaluator, interleaved schedules and the micro-batch size included."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import yaml

from nest.experiments.compare import shape_of
from nest.problem.evaluate import evaluate, make_problem
from nest.problem.plan import Stage
from nest.spec.settings import TrainingSettings
from nest.solver.launchable import (chunk_layouts, differs, interleaved_plan,
                                    search_launchable, virtual_options)
from nest.problem.space import declare, enumerate_plans, pp_dp_options

SPACE = {"zero_stages": [0, 3], "recompute_modes": ["none", "full"], "max_pp": 4}


def tiny8(tmp_path, layers: int = 8) -> str:
    """tiny_gpt with `layers` blocks (interleaving needs p x v >= 4 blocks)."""
    d = yaml.safe_load(open("config/models/tiny_gpt.yaml"))
    d.update(name=f"tiny_gpt{layers}", num_layers=layers)
    path = tmp_path / f"tiny_gpt{layers}.yaml"
    path.write_text(yaml.safe_dump(d))
    return str(path)


def as_priced(plan, pr) -> bool:
    """nest export launches the plan unchanged: its rank order resolution moves nothing."""
    from nest.interfaces.export import resolve_order

    moved: list[str] = []
    resolve_order(plan, pr, pr.cluster.node_size, moved)
    return not moved


def brute_force(problem, space_over: dict, mbs_options=()):
    """(time, plan) of the launchable optimum by scoring every plan the export launches as
    priced: 1F1B with every cut (the exhaustive enumeration with one ZeRO stage and one
    recomputation mode), interleaved with every v, placement and knob, for every micro-batch
    size."""
    best = (math.inf, None)
    for mbs in sorted(set(mbs_options) or {problem.mbs}):  # the options only, when given
        pr = problem.with_mbs(mbs)
        base = declare(pr, {**space_over, "heterogeneous_stages": False})
        base = base.with_(variants=tuple(v for v in base.variants if v.cp == 1 or v.ep == 1))
        for z, r in itertools.product(base.zero_stages, base.recompute_modes):
            sp = base.with_(zero_stages=(z,), recompute_modes=(r,))
            for plan in enumerate_plans(pr, sp):
                ev = evaluate(plan, pr)
                if ev.feasible and ev.time_per_batch_s < best[0] and as_priced(plan, pr):
                    best = (ev.time_per_batch_s, plan)
            for var in base.variants:
                for p, d in pp_dp_options(pr, base, var):
                    m = pr.num_microbatches(d, var.ep)
                    B = pr.graph.num_layers - 2
                    for v in virtual_options(B, p, m, overlap_p2p=pr.training.overlap_p2p_comm):
                        for pl, lay in itertools.product(base.placements_for(var, p, d),
                                                         chunk_layouts(B, p, v)):
                            plan = interleaved_plan(pr, var, p, d, v, pl, z, r, layout=lay)
                            ev = evaluate(plan, pr)
                            if (ev.feasible and ev.time_per_batch_s < best[0]
                                    and as_priced(plan, pr)):
                                best = (ev.time_per_batch_s, ev.plan)
    return best


@pytest.mark.parametrize("n,batch,hbm,mbs_options", [(4, 8, None, ()), (4, 16, 4e9, (2,)),
                                                     (8, 32, None, ()), (8, 8, 4e9, ())])
def test_launchable_equals_brute_force(tmp_path, n, batch, hbm, mbs_options):
    pr = make_problem(tiny8(tmp_path), "tiny_cluster", n,
                      training=TrainingSettings(global_batch=batch))
    if hbm:
        pr = pr.with_hardware(hbm_bytes=hbm)
    T, plan, _, _ = search_launchable(pr, {"space": SPACE, "mbs_options": list(mbs_options)})
    bf_T, bf_plan = brute_force(pr, SPACE, mbs_options)
    assert (plan is None) == (bf_plan is None)
    assert T == pytest.approx(bf_T, rel=1e-9)
    assert evaluate(plan, pr.with_mbs(plan.mbs)).time_per_batch_s == pytest.approx(T, rel=1e-9)
    assert not differs(plan)  # launchable: one variant, ZeRO stage, recomputation mode


def bubble_bound_search(tmp_path, blocks: int, **training):
    """Few micro-batches per stage (m = p = 4, global batch 4): the launchable search and the
    brute force on a tiny model of `blocks` blocks agree; (problem, space, time, plan, the brute
    force's plan)."""
    pr = make_problem(tiny8(tmp_path, blocks), "tiny_cluster", 4,
                      training=TrainingSettings(global_batch=4, **training)
                      ).with_hardware(hbm_bytes=4e9)
    over = {"zero_stages": [0], "recompute_modes": ["none"], "max_pp": 4}
    T, plan, _, _ = search_launchable(pr, {"space": over})
    bf_T, bf_plan = brute_force(pr, over)
    assert T == pytest.approx(bf_T, rel=1e-9)
    return pr, over, T, plan, bf_plan


def test_interleaving_wins_where_the_bubble_dominates(tmp_path):
    """Few micro-batches per stage (m = p): the interleaved schedule's bubble (p - 1) / v is the
    cheaper one, and the search picks it, with v found by the brute force too."""
    pr, over, T, plan, bf_plan = bubble_bound_search(tmp_path, 16)
    assert plan.schedule == bf_plan.schedule and plan.virtual_stages == bf_plan.virtual_stages
    assert plan.schedule == "interleaved" and plan.virtual_stages >= 2
    no = search_launchable(pr, {"space": over, "interleaved": False})[0]
    assert T < no


def test_virtual_options_follow_megatron():
    # v with a layout of 4 v chunks: the middle ones k blocks, the first and last at most k
    assert virtual_options(80, 4, 64) == [2, 3, 4, 5, 7, 10, 20]
    assert virtual_options(80, 4, 6) == []  # m not a multiple of p
    assert virtual_options(80, 1, 8) == []
    # Megatron-LM's validate_args: interleaved with pp 2 only with overlapped sends
    # ("pipeline-model-parallel size should be greater than 2" otherwise)
    assert virtual_options(40, 2, 8) == []
    assert virtual_options(40, 2, 8, overlap_p2p=True) == [2, 3, 4, 5, 6, 7, 10, 11, 20, 21]


def test_chunk_layouts_by_enumeration():
    """chunk_layouts == every split of the blocks into p v contiguous chunks whose middle chunks
    hold the same, fewest possible k >= 1 blocks and whose first and last hold at most k, found
    by enumerating all compositions; the even split (Megatron-LM's default) is one of them.
    DeepSeek-V3's 61 blocks (prime: no even interleaved split) get layouts."""
    for B, p, v in [(8, 2, 2), (9, 2, 2), (10, 2, 3), (12, 3, 2), (7, 2, 2), (12, 4, 2)]:
        C = p * v
        want = set()
        for bars in itertools.combinations(range(B + C - 1), C - 1):  # stars and bars
            edges = (-1, *bars, B + C - 1)
            sizes = [edges[i + 1] - edges[i] - 1 for i in range(C)]
            k = sizes[1]
            if (k >= 1 and set(sizes[1:-1]) == {k}
                    and sizes[0] <= k and sizes[-1] <= k):
                want.add((sizes[0], k, sizes[-1]))
        least = min((k for _, k, _ in want), default=None)
        want = {w for w in want if w[1] == least}
        assert set(chunk_layouts(B, p, v)) == want, (B, p, v)
        if B % C == 0:
            assert (B // C,) * 3 in want
    assert chunk_layouts(61, 8, 2) == [(1, 4, 4), (2, 4, 3), (3, 4, 2), (4, 4, 1)]


def test_shape_of_plans_with_submeshes():
    """Alpa-E's stages on submeshes of different sizes: the compare row and the summary count
    the devices the stages use, not pp x dp x tp x ep x cp of stage 0 (issue 25, item 9)."""
    pr = make_problem("tiny_gpt", "tiny_cluster", 8, training=TrainingSettings(global_batch=8))
    base = next(enumerate_plans(pr, declare(pr, {"max_pp": 2})))
    assert shape_of(base) == f"{base.pp}x{base.dp}x{base.tp}x{base.ep}x{base.cp}"
    two = base.with_(pp=2, dp=1, tp=2, cp=1, stages=(
        Stage(0, 2, 2, (0, 1), 0, "none", tp=2), Stage(3, 5, 6, (2, 3, 4, 5, 6, 7), 0, "none",
                                                       tp=2)))
    assert two.devices_used == 8  # the stages' devices, whatever stage 0's degrees say
    assert "2 stages of 2-6 devices" in shape_of(two) and "8 used" in shape_of(two)
    assert differs(replace(two, stages=(two.stages[0], replace(two.stages[1], zero_stage=1)))
                   ) == {"zero": [0, 1]}


def test_uneven_chunks_interleave_an_indivisible_model(tmp_path):
    """7 blocks: no p x v >= 4 divides them, so Megatron-LM's default split has no interleaving;
    a layout whose first and last chunks differ does (the embedding's chunk with one block, the
    head's alone), wins where the bubble dominates, equals the brute force over every layout,
    and the export states it with --pipeline-model-parallel-layout (nothing projected). The
    sends overlap (overlap_p2p_comm): the winner has pp 2, which Megatron-LM interleaves only
    so."""
    from nest.interfaces.export import to_megatron

    pr, over, T, plan, _ = bubble_bound_search(tmp_path, 7, overlap_p2p_comm=True)
    assert plan.schedule == "interleaved"
    assert T < search_launchable(pr, {"space": over, "interleaved": False})[0]
    blocks = [sum(1 for i in range(s.first_layer, s.last_layer + 1) if 0 < i < 8)
              for s in plan.stages]
    assert len(set(blocks[1:-1])) == 1 and (blocks[0], blocks[-1]) != (blocks[1],) * 2
    exp = to_megatron(plan, pr)
    assert not exp.warnings and exp.time_per_batch_s == pytest.approx(T, rel=1e-9)
    i = exp.args.index("--pipeline-model-parallel-layout")
    assert exp.args[i + 1].count("|") == plan.pp * plan.virtual_stages - 1
    assert "--num-virtual-stages-per-pipeline-rank" not in exp.args


def test_no_interleaved_pp2_without_overlapped_sends(tmp_path):
    """Megatron-LM's validate_args refuses an interleaved schedule with pp 2 unless the sends
    overlap ("pipeline-model-parallel size should be greater than 2"): on the 7-block model
    whose optimum with overlapped sends is interleaved with pp 2, the blocking-send search
    (the default) returns a plan Megatron-LM launches, equal to the brute force."""
    pr, _, _, plan, _ = bubble_bound_search(tmp_path, 7)
    assert not (plan.schedule == "interleaved" and plan.pp < 3), plan
    _, _, _, over_plan, _ = bubble_bound_search(tmp_path, 7, overlap_p2p_comm=True)
    assert over_plan.schedule == "interleaved" and over_plan.pp == 2


def test_no_cp_under_the_unfused_attention_core():
    """Transformer Engine has no unfused kernel for context parallelism and Megatron-LM's own
    core asserts cp 1: priced with the unfused core (the A100 / V100 default), the launchable
    space holds no cp > 1 (tiny_moe picked cp 2 there), and its optimum is the brute force's
    over the variants with cp 1. Under flash attention cp 2 stays (and wins here)."""
    tr = TrainingSettings(global_batch=8, attention="unfused")
    pr = make_problem("tiny_moe", "tiny_cluster", 8, training=tr)
    over = {"zero_stages": [1], "recompute_modes": ["none"], "max_pp": 2}
    T, plan, _, _ = search_launchable(pr, {"space": over})
    assert plan.cp == 1
    bf_T, _ = brute_force(pr, {**over, "cp": [1]})
    assert T == pytest.approx(bf_T, rel=1e-9)
    flash = make_problem("tiny_moe", "tiny_cluster", 8, training=tr.with_(attention="flash"))
    assert search_launchable(flash, {"space": over})[1].cp == 2


def test_no_cp_with_ep_in_the_launchable_space():
    """cp > 1 with ep > 1: no Megatron-LM launch builds the groups such a plan prices (the export
    projects it), so the launchable space leaves those variants out, and what it returns exports
    as priced; equal to the brute force over the space without them."""
    from nest.interfaces.export import to_megatron

    pr = make_problem("tiny_moe", "tiny_cluster", 8, training=TrainingSettings(global_batch=8))
    over = {"zero_stages": [1], "recompute_modes": ["none"], "max_pp": 2, "tp": [1], "sp": [False]}
    assert any(v.cp > 1 and v.ep > 1 for v in declare(pr, over).variants)
    T, plan, _, _ = search_launchable(pr, {"space": over})
    assert not (plan.cp > 1 and plan.ep > 1)
    assert T == pytest.approx(brute_force(pr, over)[0], rel=1e-9)
    exp = to_megatron(plan, pr)
    assert not exp.warnings and exp.time_per_batch_s == pytest.approx(T, rel=1e-9)


def test_the_launchable_graph_plans_as_the_whole_graph():
    """`nest plan` builds the layer graph of the launchable variants only (make_problem's
    launchable_only): the variants the launchable space searches, in the same order, so the same
    plan, time and search statistics as with every declared variant traced, at every micro-batch
    size (with_mbs keeps the subset)."""
    from nest.solver.launchable import launchable_space

    tr = TrainingSettings(global_batch=16)
    full = make_problem("tiny_moe", "tiny_cluster", 8, training=tr)
    sub = make_problem("tiny_moe", "tiny_cluster", 8, training=tr, launchable_only=True)
    assert any(not v.launchable for v in full.graph.variants)
    assert tuple(sub.graph.variants) == tuple(v for v in full.graph.variants if v.launchable)
    assert sub.with_mbs(2).graph.variants == sub.graph.variants
    over = {"zero_stages": [0, 1], "recompute_modes": ["none", "full"], "max_pp": 4}
    assert (launchable_space(declare(sub, over), sub).variants
            == launchable_space(declare(full, over), full).variants)
    settings = {"space": over, "mbs_options": [1, 2]}
    T, plan, stats, pr = search_launchable(full, settings)
    T2, plan2, stats2, pr2 = search_launchable(sub, settings)
    assert plan is not None and (T2, plan2, pr2.mbs) == (T, plan, pr.mbs)
    assert {k: stats2[k] for k in ("candidates", "visited", "interleaved")} == {
        k: stats[k] for k in ("candidates", "visited", "interleaved")}


def test_nothing_fits_names_the_launchable_space():
    """The reason a launchable search found nothing names the variants it searched: not the
    cp > 1 ones the unfused core leaves out (Mixtral-8x22B on 64 A100 40 GB listed cp 1/2/4/8)."""
    from nest.planners.registry import NoPlan
    from nest.solver import plan_launchable

    tr = TrainingSettings(global_batch=8, attention="unfused")
    pr = make_problem("tiny_moe", "tiny_cluster", 8, training=tr).with_hardware(hbm_bytes=2e7)
    over = {"space": {"zero_stages": [0], "recompute_modes": ["none"], "tp": [1]}}
    assert any(v.cp > 1 for v in declare(pr, over["space"]).variants)
    with pytest.raises(NoPlan) as e:
        plan_launchable(pr, over)
    assert "no plan of the space fits" in str(e.value) and "cp2" not in str(e.value), str(e.value)
