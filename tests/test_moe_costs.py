"""MoE terms of the cost kernel: the receiving side's local-expert sort of Megatron-Core's
alltoall token dispatcher (nest.costs.table.moe_local_sort_op) and the expert-parallel
all-to-all under routing imbalance. Each checked against its closed-form byte count."""

from dataclasses import replace

import pytest

from nest.costs.roofline import elementwise_efficiency
from nest.costs.table import MOE_SORT, layer_times, moe_local_sort_op
from nest.graph.closed_form import block_cost
from nest.graph.layer_graph import Variant
from nest.spec.catalog import load_hardware, load_model


@pytest.fixture(scope="module")
def mixtral():
    return load_model("mixtral_8x7b", seq_len=4096)


def test_local_sort_bytes_closed_form(mixtral):
    """E = 8 experts, top-2, ep = 4: 2 local experts, so each of the two all-to-alls per phase
    (dispatch, combine) is followed / preceded by one sort that reads and writes the b s k h
    received BF16 elements: 2 x 2 b s k h bytes per kernel, 2 kernels per phase."""
    m, b = mixtral, 2
    op, = moe_local_sort_op(block_cost(m, b, Variant(ep=4)))
    tokens = b * m.seq_len * m.top_k
    assert op.name == MOE_SORT and op.kind == "memory" and op.count == 2
    assert op.fwd_bytes == op.bwd_bytes == 2 * 2 * tokens * m.hidden_size


def test_local_sort_absent_without_it(mixtral):
    """No expert parallelism (no all-to-all) or one expert per rank (ep = E): nothing to sort."""
    assert moe_local_sort_op(block_cost(mixtral, 1, Variant())) == ()
    assert moe_local_sort_op(block_cost(mixtral, 1, Variant(ep=8))) == ()
    assert moe_local_sort_op(block_cost(load_model("gpt3_175b", seq_len=2048), 1, Variant())) == ()


def test_local_sort_enters_the_layer_time(mixtral):
    """The layer's forward and backward each grow by the roofline of two kernels moving the
    closed-form bytes (without the profile: the graph's own moe_permute is priced so too)."""
    hw = load_hardware("h100_sxm")
    m, b = mixtral, 1
    cost = block_cost(m, b, Variant(ep=4))
    bare = replace(cost, collectives=tuple(c for c in cost.collectives if c.kind != "all_to_all"))
    nbytes = 2 * (2 * b * m.seq_len * m.top_k * m.hidden_size)  # read + write, 2 B each
    one = nbytes / (hw.hbm_bytes_per_s * elementwise_efficiency(hw)) + hw.kernel_overhead_s
    with_sort, without = layer_times(hw, cost), layer_times(hw, bare)
    assert with_sort.fwd_s - without.fwd_s == pytest.approx(2 * one, rel=1e-9)
    assert with_sort.bwd_s - without.bwd_s == pytest.approx(2 * one, rel=1e-9)
    assert with_sort.recompute_s["full"] - without.recompute_s["full"] == pytest.approx(
        2 * one, rel=1e-9)


def test_routing_imbalance_prices_the_busiest_ranks_bytes():
    """Mixtral 8x7B, ep 8 inside one DGX H100: with moe_routing_imbalance r the expert-parallel
    all-to-all terms equal the group's alpha-beta line at r times the balanced bytes (the
    busiest rank's), so at r = 2 each term lies between the balanced one and twice it; every
    other term is untouched; the schema refuses r < 1."""
    import numpy as np

    from nest.costs.groups import group_terms, inner_groups
    from nest.costs.layers import layer_table
    from nest.common.errors import SpecError
    from nest.network.collectives import group_lines, lines_time
    from nest.problem.evaluate import make_problem
    from nest.spec.catalog import validate

    v = Variant(ep=8)
    pr = make_problem("mixtral_8x7b", "dgx_h100_superpod", 8).with_variants([v])
    ids = list(range(8))
    x = {}
    for r in (1.0, 2.0):
        p = pr.with_training(moe_routing_imbalance=r)
        g = group_terms(p, layer_table(p, v, ("none",)), ids, 1)
        x[r] = (g.names, np.diff(g.cum_LK, axis=0))
    names, x1 = x[1.0]
    assert x[2.0][0] == names
    a2a = np.array([n.startswith("ep_all_to_all") for n in names])
    assert a2a.any()
    blk = 1  # a transformer block
    col = next(c for c in pr.graph.layers[blk].costs[v.key].collectives if c.kind == "all_to_all")
    lines = group_lines(pr.cluster, "all_to_all", inner_groups(ids, 1, 1, 8, 1)["ep"])
    for r, (_, xr) in x.items():
        want = float(lines_time(lines, r * col.bytes)) * col.count
        assert xr[blk, a2a] == pytest.approx(want, rel=1e-9)
    # alpha-beta: more than the balanced time, less than twice it (the latency is paid once)
    assert (x1[blk, a2a] < x[2.0][1][blk, a2a]).all()
    assert (x[2.0][1][blk, a2a] < 2 * x1[blk, a2a]).all()
    assert (x[2.0][1][:, ~a2a] == x1[:, ~a2a]).all()
    with pytest.raises(SpecError):
        validate({"moe_routing_imbalance": 0.5}, "training", "training.yaml")


def test_expected_max_normal_closed_forms():
    """E[max] of 2 standard normals is 1/sqrt(pi); of 3, 3 / (2 sqrt(pi))."""
    from math import pi, sqrt

    from nest.costs.groups import expected_max_normal

    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / sqrt(pi), rel=1e-9)
    assert expected_max_normal(3) == pytest.approx(1.5 / sqrt(pi), rel=1e-9)


def test_forced_balance_imbalance_brute_force():
    """Random router logits (Megatron-Core moe_router_force_load_balancing): each token's k
    experts a uniform k-subset of E. 400 draws of 8 ranks x 512 tokens, top-4 of 32 experts:
    the busiest rank's received copies over the mean, against the closed form (Monte Carlo
    standard error ~0.0006; the form without the sum constraint's 1/sqrt(1 - 1/ep) is 0.0027
    lower and fails)."""
    import numpy as np

    from nest.costs.groups import forced_balance_imbalance

    rng = np.random.default_rng(0)
    T, k, E, ep = 512, 4, 32, 8
    ratios = []
    for _ in range(400):
        idx = np.argpartition(rng.random((ep * T, E)), k, axis=1)[:, :k]
        ratios.append(np.bincount((idx // (E // ep)).ravel(), minlength=ep).max() / (T * k))
    assert forced_balance_imbalance(T, k, E, ep) == pytest.approx(np.mean(ratios), abs=0.0015)
    assert forced_balance_imbalance(T, k, E, 1) == 1.0
