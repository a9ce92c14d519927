"""Which placements Megatron-LM's CLI launches as priced (nest.problem.placement.launch_order):
the export's rank-order resolution and `nest plan`'s launchable space share it. Checked against
ranks laid out from Megatron's own mixed-radix rule (RankGenerator: rank = sum of coordinate x
stride, fastest first) and torchrun's one block of consecutive ranks per node."""

from __future__ import annotations

import itertools

import pytest

from nest.graph.layer_graph import Variant
from nest.problem.placement import (CLI_ORDERS, all_orders, canonical_order, expressible,
                                    launch_order, launches_as_priced, stage_device_ids)
from nest.problem.space import SearchSpace

DIMS = ("tp", "cp", "ep", "dp", "pp")


def megatron_rank_devices(stage_ids, sizes: dict, order: str) -> list[int]:
    """Device of each rank: decode the rank's coordinates under `order` (fastest first) and
    read the stage's slot (dp, ep, cp, tp) listing, tp fastest."""
    out = []
    world = 1
    for n in DIMS:
        world *= sizes[n]
    for rank in range(world):
        k, r = {}, rank
        for name in canonical_order(order).split("-"):
            k[name] = r % sizes[name]
            r //= sizes[name]
        slot = ((k["dp"] * sizes["ep"] + k["ep"]) * sizes["cp"] + k["cp"]) * sizes["tp"] + k["tp"]
        out.append(stage_ids[k["pp"]][slot])
    return out


def reference(stage_ids, sizes: dict, per_node: int) -> str | None:
    cands = [o for o in CLI_ORDERS if expressible(*(sizes[n] for n in DIMS), o)]
    maps = {o: megatron_rank_devices(stage_ids, sizes, o) for o in cands}
    for o in cands:
        if maps[o] == list(range(len(maps[o]))):
            return o
    for o in cands:
        nodes = [dev // per_node for dev in maps[o]]
        runs = [n for i, n in enumerate(nodes) if i == 0 or nodes[i - 1] != n]
        if len(runs) == len(set(runs)):
            return o
    return None


DEGREES = [d for d in itertools.product((1, 2), (1, 2), (1, 2), (1, 2, 3), (1, 2, 4))
           if not (d[1] > 1 and d[2] > 1)]


@pytest.mark.parametrize("tp,cp,ep,dp,pp", DEGREES)
def test_launch_order_equals_megatron_rank_maps(tp, cp, ep, dp, pp):
    sizes = dict(tp=tp, cp=cp, ep=ep, dp=dp, pp=pp)
    orders = sorted({canonical_order(o) for o in (*CLI_ORDERS, *all_orders())})
    for order in orders:
        ids = stage_device_ids(pp, dp, tp, cp, ep, order)
        for per_node in (1, 2, 4, 8):
            want = reference(ids, sizes, per_node)
            assert launch_order(ids, tp, cp, ep, dp, pp, per_node) == want, (order, per_node)
            assert launches_as_priced(tp, cp, ep, dp, pp, order, per_node) == (want is not None)


def test_stage_major_with_experts_needs_whole_nodes_per_stage():
    """tp-cp-ep-pp-dp with ep > 1 and pp > 1 is no CLI order for these groups; the default order
    pins the plan's devices only where a stage's tp x ep block fills whole nodes (or dp = 1, where
    both orders place the same devices)."""
    assert not launches_as_priced(1, 1, 2, 2, 2, "stage_major", 4)
    assert launches_as_priced(1, 1, 2, 2, 2, "stage_major", 2)
    assert launches_as_priced(1, 1, 2, 1, 2, "stage_major", 4)
    assert launches_as_priced(1, 1, 2, 2, 1, "stage_major", 4)
    assert launches_as_priced(1, 1, 1, 2, 2, "stage_major", 4)  # a CLI order itself
    assert launches_as_priced(2, 1, 4, 2, 2, "replica_major", 8)


def test_the_launchable_space_keeps_only_placements_launched_as_priced():
    v = Variant(1, False, 2, 1)
    space = SearchSpace(variants=(v,))
    assert space.placements_for(v, 2, 2) == ("replica_major", "stage_major")
    assert space.with_(launch_node=4).placements_for(v, 2, 2) == ("replica_major",)
    assert space.with_(launch_node=2).placements_for(v, 2, 2) == ("replica_major", "stage_major")
    orders = SearchSpace(variants=(v,), placements=("orders",))
    for n in (1, 2, 4):
        kept = orders.with_(launch_node=n).placements_for(v, 2, 2)
        assert kept == tuple(o for o in orders.placements_for(v, 2, 2)
                             if launches_as_priced(1, 1, 2, 2, 2, o, n))



def test_solver_memos_keep_the_launch_filter_apart(monkeypatch):
    """The solver keeps joint bounds and interleaved placement floors in the problem's cache; a
    value priced on the launchable space (fewer placements: launch_node) must not be handed to a
    search of the full space on the same problem, nor the other way round."""
    import numpy as np

    import nest.solver as solver
    import nest.solver.interleaved_screen as screen
    from nest.costs.layers import layer_table
    from nest.problem.evaluate import make_problem
    from nest.problem.space import declare

    monkeypatch.setattr(solver, "joint_minmax",
                        lambda problem, space, *a: 1.0 + space.launch_node)
    monkeypatch.setattr(screen, "_placement_floors",
                        lambda problem, space, *a: np.array([1.0 + space.launch_node]))
    for first, second in ((4, 0), (0, 4)):
        pr = make_problem("tiny_moe", "tiny_cluster", 8)  # a fresh cache
        full = declare(pr, {"zero_stages": [1], "recompute_modes": ["none"],
                            "heterogeneous_stages": False})
        v = full.variants[0]
        lts = [layer_table(pr, v, full.recompute_modes)]
        a = solver._joint(pr, full.with_(launch_node=first), lts, 2, 2, 10.0)
        b = solver._joint(pr, full.with_(launch_node=second), lts, 2, 2, 10.0)
        assert (a, b) == ((1.0 + first) * (1 - 1e-12), (1.0 + second) * (1 - 1e-12))
        cuts = [(0, 1), (2, 3)]
        fa = screen.placement_floors(pr, full.with_(launch_node=first), v, 2, 2, 2, cuts)
        fb = screen.placement_floors(pr, full.with_(launch_node=second), v, 2, 2, 2, cuts)
        assert (float(fa[0]), float(fb[0])) == (1.0 + first, 1.0 + second)
