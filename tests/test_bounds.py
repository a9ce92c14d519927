"""The solver's bounds (nest.solver.bounds) are valid lower bounds: none ever exceeds the exact
optimum of its candidate (variant, p, d), so branch and bound is exact; the pruned search returns
the unpruned optimum. Random instances: tests/strategies.py (clusters of 2-4 levels, node sizes
that d need not be a multiple of, oversubscribed and flattened levels; tiny GPT / Llama / MoE,
tied and untied; tight and roomy HBM)."""

import math

import pytest
from hypothesis import HealthCheck, given, settings

from nest.costs.stage import layer_table
from nest.network.collectives import flattened
from nest.problem import make_problem
from nest.settings import TrainingSettings
from nest.solver import bounds, candidate_optimum, search
from nest.space import declare, pp_dp_options
from strategies import build, instance_specs

REL = 1e-9
HYPOTHESIS = dict(derandomize=True, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def candidate_bounds(problem, space):
    """(variant, p, d, {bound name: value}) for every candidate of the space, each bound as the
    solver uses it (times per batch)."""
    for v in space.variants:
        lt = layer_table(problem, v, space.recompute_modes)
        options = list(pp_dp_options(problem, space, v))
        if not options:
            continue
        x_lb, floor_LLR = bounds.compute_bounds(problem, space, lt, max(p for p, _ in options))
        sends = bounds.p2p_floor(problem, lt, space)
        memory = {}
        for p, d in options:
            m = problem.num_microbatches(d, v.ep)
            if p not in memory:
                memory[p] = bounds.memory_aware_bound(problem, space, lt, p, floor_LLR, sends)
            yield v, p, d, {"compute_bounds": (m + p - 1) * x_lb[p],
                            "memory_aware_bound": (m + p - 1) * memory[p],
                            "weight_bound": bounds.weight_bound(problem, space, lt, p, d)}


def assert_bounds_valid(problem, space):
    """Every bound of every candidate <= the candidate's exact optimum (inf if nothing fits);
    returns the number of candidates checked."""
    n = 0
    for v, p, d, got in candidate_bounds(problem, space):
        opt = candidate_optimum(problem, space, v, p, d)
        for name, lb in got.items():
            assert lb <= opt * (1 + REL), (
                f"{name} = {lb!r} exceeds the exact optimum {opt!r} of candidate "
                f"{v.key} p={p} d={d} (ratio {lb / opt:.6g})")
        n += 1
    return n


@settings(max_examples=70, **HYPOTHESIS)
@given(instance_specs())
def test_every_bound_is_at_most_the_candidate_optimum(spec):
    """For every candidate (variant, p, d) of a random instance, each of the three bounds the
    solver uses ((m+p-1) X_lb[p] from compute_bounds, (m+p-1) memory_aware_bound, weight_bound)
    is at most the candidate's exact optimum over all cuts, options and placements (1e-9 rel);
    a bound of inf (claimed infeasible) only where nothing fits."""
    problem, space = build(spec)
    assert_bounds_valid(problem, space)


@settings(max_examples=50, **HYPOTHESIS)
@given(instance_specs())
def test_pruned_search_equals_unpruned(spec):
    """Branch and bound is exact: the pruned search returns the same optimum time as the search
    that visits every candidate (both None where nothing fits), and visits no more candidates."""
    problem, space = build(spec)
    T, best, stats = search(problem, space, prune=True)
    T_all, best_all, stats_all = search(problem, space, prune=False)
    assert (best is None) == (best_all is None)
    if best_all is not None:
        assert T == pytest.approx(T_all, rel=REL)
        v, p, d = best[:3]
        assert T == pytest.approx(candidate_optimum(problem, space, v, p, d), rel=REL)
    assert stats["visited"] <= stats_all["visited"]


SPINE_LEAF_SPACE = {"max_pp": 3, "zero_stages": [0, 1, 2, 3],
                    "recompute_modes": ["none", "selective", "full"],
                    "placements": ["replica_major", "stage_major"]}


@pytest.mark.parametrize("network", ["real", "flattened", "flattened_fast"])
@pytest.mark.parametrize("model,n,batch", [("tiny_gpt", 24, 9), ("tiny_llama", 32, 27),
                                           ("tiny_moe", 24, 18)])
def test_spine_leaf_groups_across_nodes(model, n, batch, network):
    """Regression (issue 11): on the H100 spine-leaf cluster (node of 8, 12.5 GB/s leaf,
    oversubscribed spine) data-parallel degrees 3 and 9 put replicas and tp groups across node
    boundaries; every bound stays at most the exact optimum of its candidate, on the real network
    and on its flattened views (every level as fast as NVLink, or 4x faster above the node), with
    HBM tight enough (1.6 GB, 1.5 GB of it overhead) for memory to bind."""
    pr = make_problem(model, "h100_spineleaf", n, training=TrainingSettings(global_batch=batch))
    if network != "real":
        bw = pr.cluster.levels[0].bytes_per_s * (4 if network == "flattened_fast" else 1)
        pr = pr.with_cluster(flattened(pr.cluster, bw))
    pr = pr.with_hardware(hbm_bytes=1.6e9)
    space = declare(pr, SPINE_LEAF_SPACE)
    ds = {d for v in space.variants for _, d in pp_dp_options(pr, space, v)}
    assert {3, 9} & ds
    assert assert_bounds_valid(pr, space) > 0
    T, best, _ = search(pr, space)
    T_all, _, _ = search(pr, space, prune=False)
    assert best is not None and T == pytest.approx(T_all, rel=REL)
    assert math.isfinite(T)
