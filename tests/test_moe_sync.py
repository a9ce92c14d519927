"""The MoE terms of nest.costs.moe_time: the dropless dispatcher's device-to-host wait
(launch_queue_s, dispatch_sync_queued), the busiest expert-parallel rank's expert compute
(busiest_rank_ops) and the experts' bias loop (moe_expert_bias_op), each checked another
way: an event-by-event simulation of a host issuing calls to a FIFO GPU stream over a stack of
layers, and hand-computed sums."""

from dataclasses import replace

import pytest

from nest.costs.profiled import price_op
from nest.costs.moe_time import (EXPERT_BIAS, MOE_SORT, SYNC_AFTER, busiest_rank_ops,
                                 dispatch_sync_queued, launch_queue_s, moe_expert_bias_op)
from nest.costs.table import layer_times, moe_local_sort_op
from nest.graph.closed_form import block_cost
from nest.graph.layer_graph import Variant
from nest.spec.catalog import load_hardware, load_model


@pytest.fixture(scope="module")
def mixtral_ep4():
    """Mixtral 8x7B's block at ep 4 from the torch.fx graph (its routing, permutation and
    combine operators: the closed-form graph has the router GEMM only)."""
    from nest.graph.fx_extract import build_layer_graph_fx

    g = build_layer_graph_fx(load_model("mixtral_mini"), 1, [Variant(ep=4)])
    return next(la.costs[Variant(ep=4).key] for la in g.layers
                if any(op.name == "moe_route" for op in la.costs[Variant(ep=4).key].ops))


def _calls(cost, hw):
    """One layer's forward GPU seconds per call in the order Megatron-Core issues them (by hand:
    the graph's order, the local-expert sort's two calls around the expert GEMMs), and the index
    of the last call before the device-to-host copy (the routing's)."""
    ops = (*cost.ops, *moe_local_sort_op(cost))
    f = {op.name: price_op(hw, op, None).fwd_s for op in ops}
    out, copy_at = [], None
    for op in cost.ops:
        if op.name == "expert_gate_up":
            out.append(f[MOE_SORT] / 2)
        out += [f[op.name] / op.count] * op.count
        if op.name == "expert_down":
            out.append(f[MOE_SORT] / 2)
        if op.name in SYNC_AFTER:  # the last of them
            copy_at = len(out) - 1
    return out, copy_at


def _simulate_stack(calls, copy_at, queued, host_s, layers):
    """A host issuing one call every host_s to a GPU that runs its stream in order; in every
    layer, after issuing the call at copy_at and `queued` more, the host waits until the GPU
    has finished the call at copy_at (the routing counts copied to the host). The GPU's end."""
    host = gpu = 0.0
    for _ in range(layers):
        done_copy = None
        for i, g in enumerate(calls):
            host += host_s
            gpu = max(gpu, host) + g
            if i == copy_at:
                done_copy = gpu
            if i == copy_at + queued:
                host = max(host, done_copy)
    return gpu


@pytest.mark.parametrize("host_us", [16.7, 150.0, 900.0])
@pytest.mark.parametrize("dispatcher", ["alltoall", "hybridep"])
def test_synced_forward_is_the_simulated_stack_per_layer(mixtral_ep4, host_us, dispatcher):
    """Steady state of a stack of identical layers, simulated call by call, against the layer's
    priced forward: GPU-bound (16.7 us per call: the measured H100 host), partly and wholly
    host-bound (150 and 900 us)."""
    hw = replace(load_hardware("h100_sxm"), host_fwd_s_per_op=host_us * 1e-6)
    cost = mixtral_ep4
    if dispatcher == "hybridep":  # the sender-side permutations run inside HybridEP's kernels
        cost = replace(cost, ops=tuple(op for op in cost.ops
                                       if op.name not in ("moe_permute", "moe_combine")))
    queued = 1 if dispatcher == "alltoall" else 0
    calls, copy_at = _calls(cost, hw)
    per_layer = (_simulate_stack(calls, copy_at, queued, hw.host_fwd_s_per_op, 12)
                 - _simulate_stack(calls, copy_at, queued, hw.host_fwd_s_per_op, 4)) / 8
    got = layer_times(hw, cost, None, dispatcher=dispatcher).fwd_s
    assert got == pytest.approx(per_layer, rel=1e-9)


def test_wait_costs_one_host_call_when_nothing_is_queued(mixtral_ep4):
    """GPU-bound layer (a 2 us host call: mixtral_mini's small layer is near host-bound at the
    measured 16.7 us): under HybridEP the GPU idles for the one call the host issues after the
    wait; under the alltoall dispatcher the queued permutation (longer than a call) covers it;
    padded to capacity there is no wait."""
    hw = replace(load_hardware("h100_sxm"), host_fwd_s_per_op=2e-6)
    bare = replace(mixtral_ep4, ops=tuple(op for op in mixtral_ep4.ops
                                          if op.name not in ("moe_permute", "moe_combine")))
    padded = layer_times(hw, bare, None, dispatcher="hybridep", moe_padded=True).fwd_s
    synced = layer_times(hw, bare, None, dispatcher="hybridep").fwd_s
    assert synced - padded == pytest.approx(hw.host_fwd_s_per_op, rel=1e-6)
    a2a_padded = layer_times(hw, mixtral_ep4, None, moe_padded=True).fwd_s
    assert layer_times(hw, mixtral_ep4, None).fwd_s == pytest.approx(a2a_padded, rel=1e-12)


def test_launch_queue_closed_forms():
    """GPU-bound: one host call then the GPU's sum; host-bound: every call issued, then the
    last one's GPU time; calls already queued start at once."""
    seg = [(10.0, 1), (6.0, 3), (1.0, 1)]  # 5 calls: 10, 2, 2, 2, 1
    assert launch_queue_s(seg, 0.5) == pytest.approx(0.5 + 17.0)
    assert launch_queue_s(seg, 100.0) == pytest.approx(5 * 100.0 + 1.0)
    assert launch_queue_s(seg, 0.5, queued=1) == pytest.approx(17.0)
    assert launch_queue_s(seg, 4.0, queued=1) == pytest.approx(max(17.0, 4 * 4.0 + 1.0,
                                                                   1 * 4.0 + 7.0))


def test_no_wait_without_routed_experts():
    hw = load_hardware("h100_sxm")
    dense = block_cost(load_model("gpt3_175b", seq_len=2048), 1, Variant())
    assert dispatch_sync_queued(dense.ops, "alltoall") is None
    assert layer_times(hw, dense, None) == layer_times(hw, dense, None, moe_padded=True)


def test_busiest_rank_scales_the_expert_side_only(mixtral_ep4):
    """Imbalance r: the expert GEMMs, activation and local sort times by r (their sum by hand),
    every other operator unchanged; without an expert-parallel all-to-all, nothing scales (no
    host floor: mixtral_mini's small layer is host-bound at the measured H100 host)."""
    hw, r = replace(load_hardware("h100_sxm"), host_fwd_s_per_op=0.0, host_bwd_s_per_op=0.0), 1.25
    ops = (*mixtral_ep4.ops, *moe_local_sort_op(mixtral_ep4))
    names = busiest_rank_ops(mixtral_ep4, ops)
    assert set(names) == {"expert_gate_up", "expert_swiglu", "expert_down", MOE_SORT} & set(
        op.name for op in ops) and MOE_SORT in names
    side = sum(price_op(hw, op, None).bwd_s for op in ops if op.name in names)
    base = layer_times(hw, mixtral_ep4, None, moe_padded=True)
    imb = layer_times(hw, mixtral_ep4, None, moe_imbalance=r, moe_padded=True)
    assert imb.bwd_s - base.bwd_s == pytest.approx((r - 1) * side, rel=1e-9)
    side_f = sum(price_op(hw, op, None).fwd_s for op in ops if op.name in names)
    assert imb.fwd_s - base.fwd_s == pytest.approx((r - 1) * side_f, rel=1e-9)
    no_ep = block_cost(load_model("mixtral_8x7b", seq_len=4096), 1, Variant())
    assert busiest_rank_ops(no_ep, no_ep.ops) == ()
    assert layer_times(hw, no_ep, None, moe_imbalance=r) == layer_times(hw, no_ep, None)


def test_expert_bias_loop_closed_form(mixtral_ep4):
    """Megatron-Core's _apply_bias on E = 2 local experts of mixtral_mini (h 1,024, seq 1,024,
    top-2, ep 4: 2,048 received tokens of h values): 2 E + 1 = 5 calls moving 12 bytes per
    output element, forward and backward; the layer grows by their roofline (no host floor);
    absent without biases."""
    from nest.costs.roofline import elementwise_efficiency

    assert moe_expert_bias_op(mixtral_ep4, False) == ()
    op, = moe_expert_bias_op(mixtral_ep4, True)
    assert op.name == EXPERT_BIAS and op.kind == "memory" and op.count == 5
    assert op.count * op.fwd_bytes == op.count * op.bwd_bytes == pytest.approx(
        12 * 2048 * 1024)
    hw = replace(load_hardware("h100_sxm"), host_fwd_s_per_op=0.0, host_bwd_s_per_op=0.0)
    one = 12 * 2048 * 1024 / (hw.hbm_bytes_per_s * elementwise_efficiency(hw))
    plain = layer_times(hw, mixtral_ep4, None, moe_padded=True)
    biased = layer_times(hw, mixtral_ep4, None, moe_padded=True, expert_bias=True)
    for phase in ("fwd_s", "bwd_s"):
        assert getattr(biased, phase) - getattr(plain, phase) == pytest.approx(
            one + 5 * hw.kernel_overhead_s, rel=1e-9)


def test_current_scaling_casts_read_twice_and_launch_four_kernels():
    """FP8 current scaling (recipe tensorwise: Transformer Engine's amax zeroing, amax, scale
    and quantize kernels per tensor, per expert in a grouped linear): each expert cast reads its
    BF16 input once more (2 bytes per element) and launches 4 kernels instead of one
    cast_transpose (read 2, write 1 + 1, one launch); 16 experts of 2,048 x 2,048 inputs and
    1,536-wide outputs, by hand."""
    from nest.costs.profiled import fp8_cast_s
    from nest.graph.layer_graph import Op

    hw = load_hardware("h100_sxm")
    m, n, k, e = 2048, 1536, 2048, 16
    op = Op("expert_gate_up", "matmul", 2.0 * m * n * k * e, 4.0 * m * n * k * e, 0, 0,
            (m, n, k), e)
    bw = hw.hbm_bytes_per_s * hw.memory_efficiency
    d = fp8_cast_s(hw, op, "delayed")
    c = fp8_cast_s(hw, op, "tensorwise")
    assert d == pytest.approx((e * (4 * m * k / bw + hw.kernel_overhead_s),
                               e * (4 * m * n / bw + hw.kernel_overhead_s)))
    assert c == pytest.approx((e * (6 * m * k / bw + 4 * hw.kernel_overhead_s),
                               e * (6 * m * n / bw + 4 * hw.kernel_overhead_s)))
    # a norm-fed dense linear takes its input's amax from the norm: the amax's zeroing and the
    # scale launch more in forward; its output gradient runs the amax pass (nest.costs.fp8_quant)
    dense = replace(op, name="mlp_up", count=1)
    (tf, tb), (df, db) = fp8_cast_s(hw, dense, "tensorwise"), fp8_cast_s(hw, dense, "delayed")
    assert tf - df == pytest.approx(2 * hw.kernel_overhead_s)
    assert tb - db == pytest.approx(2 * m * n / bw + 3 * hw.kernel_overhead_s)
    # the layer time carries it for every expert FP8 GEMM: the difference is the sum by hand
    cost = block_cost(load_model("mixtral_8x7b", seq_len=4096), 1, Variant(ep=4))
    bare = replace(hw, host_fwd_s_per_op=0.0, host_bwd_s_per_op=0.0)
    from nest.costs.roofline import is_fp8_gemm

    extra = sum(fp8_cast_s(bare, o, "tensorwise")[0] - fp8_cast_s(bare, o, "delayed")[0]
                for o in cost.ops if is_fp8_gemm(o, "fp8"))
    assert extra > 0
    got = (layer_times(bare, cost, None, "fp8", fp8_recipe="tensorwise").fwd_s
           - layer_times(bare, cost, None, "fp8").fwd_s)
    assert got == pytest.approx(extra, rel=1e-9)
