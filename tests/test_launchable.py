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
from nest.solver.launchable import (differs, interleaved_plan, search_launchable,
                                    virtual_options)
from nest.problem.space import declare, enumerate_plans, pp_dp_options

SPACE = {"zero_stages": [0, 3], "recompute_modes": ["none", "full"], "max_pp": 4}


def tiny8(tmp_path, layers: int = 8) -> str:
    """tiny_gpt with `layers` blocks (interleaving needs p x v >= 4 blocks)."""
    d = yaml.safe_load(open("config/models/tiny_gpt.yaml"))
    d.update(name=f"tiny_gpt{layers}", num_layers=layers)
    path = tmp_path / f"tiny_gpt{layers}.yaml"
    path.write_text(yaml.safe_dump(d))
    return str(path)


def brute_force(problem, space_over: dict, mbs_options=()):
    """(time, plan) of the launchable optimum by scoring every plan: 1F1B with every cut (the
    exhaustive enumeration with one ZeRO stage and one recomputation mode), interleaved with every
    v, placement and knob, for every micro-batch size."""
    best = (math.inf, None)
    for mbs in sorted({problem.mbs, *mbs_options}):
        pr = problem.with_mbs(mbs)
        base = declare(pr, {**space_over, "heterogeneous_stages": False})
        for z, r in itertools.product(base.zero_stages, base.recompute_modes):
            sp = base.with_(zero_stages=(z,), recompute_modes=(r,))
            for plan in enumerate_plans(pr, sp):
                ev = evaluate(plan, pr)
                if ev.feasible and ev.time_per_batch_s < best[0]:
                    best = (ev.time_per_batch_s, plan)
            for var in base.variants:
                for p, d in pp_dp_options(pr, base, var):
                    m = pr.num_microbatches(d, var.ep)
                    for v in virtual_options(pr.graph.num_layers - 2, p, m):
                        for pl in base.placements_for(var, p, d):
                            ev = evaluate(interleaved_plan(pr, var, p, d, v, pl, z, r), pr)
                            if ev.feasible and ev.time_per_batch_s < best[0]:
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


def test_interleaving_wins_where_the_bubble_dominates(tmp_path):
    """Few micro-batches per stage (m = p): the interleaved schedule's bubble (p - 1) / v is the
    cheaper one, and the search picks it, with v found by the brute force too."""
    pr = make_problem(tiny8(tmp_path, 16), "tiny_cluster", 4,
                      training=TrainingSettings(global_batch=4)).with_hardware(hbm_bytes=4e9)
    over = {"zero_stages": [0], "recompute_modes": ["none"], "max_pp": 4}
    T, plan, _, _ = search_launchable(pr, {"space": over})
    bf_T, bf_plan = brute_force(pr, over)
    assert T == pytest.approx(bf_T, rel=1e-9)
    assert plan.schedule == bf_plan.schedule and plan.virtual_stages == bf_plan.virtual_stages
    assert plan.schedule == "interleaved" and plan.virtual_stages >= 2
    no = search_launchable(pr, {"space": over, "interleaved": False})[0]
    assert T < no


def test_virtual_options_follow_megatron():
    assert virtual_options(80, 4, 64) == [2, 4, 5, 10, 20]  # 4 x v divides 80 blocks
    assert virtual_options(80, 4, 6) == []  # m not a multiple of p
    assert virtual_options(80, 1, 8) == []


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
