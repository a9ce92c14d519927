"""MoE terms of the cost kernel: the receiving side's local-expert sort of Megatron-Core's
alltoall token dispatcher (nest.costs.table.moe_local_sort_op) and the expert-parallel
all-to-all under routing imbalance. Each checked against its closed-form byte count."""

from dataclasses import replace

import pytest

from nest.costs.roofline import elementwise_efficiency
from nest.costs.table import MOE_SORT, layer_times, moe_local_sort_op
from nest.graph.closed_form import block_cost
from nest.graph.layer_graph import Variant
from nest.specs import load_hardware, load_model


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
