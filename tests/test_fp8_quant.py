"""Transformer Engine's FP8 quantization kernels per recipe (nest.costs.fp8_quant): the cast of a
gathered output gradient, current scaling's amax passes, scale kernels and tp amax all-reduces,
each against a hand computation from bytes, bandwidth and launches."""

from pathlib import Path

import numpy as np
import pytest

from nest.costs.alike import inner_groups
from nest.costs.fp8_quant import AMAX_BYTES, amax_reductions, fp8_cast_s
from nest.costs.table import layer_times
from nest.graph.closed_form import block_cost
from nest.graph.layer_graph import Op, Variant
from nest.network.collectives import group_lines, lines_time
from nest.problem.evaluate import evaluate
from nest.problem.plan_spec import load_plan
from nest.spec.catalog import load_hardware, load_model

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "llama3_70b_h100_fp8_bridge.yaml"


@pytest.fixture(scope="module")
def hw():
    return load_hardware("h100_sxm")


def _gemm(name, m, n, k, count=1):
    return Op(name, "matmul", 2.0 * m * n * k, 4.0 * m * n * k, 0, 0, (m, n, k), count)


def test_gathered_output_gradient_is_cast_on_the_shard_and_transposed_gathered(hw):
    """A row-parallel output gradient under sequence parallelism: cast of the shard (read 2,
    write 1 byte per element of m n / tp) + transpose of the gathered FP8 copy (read 1, write 1
    of m n), two launches; elsewhere one cast-transpose of 4 bytes per element. The input's
    cast (4 m k) is the same either way. Delayed scaling adds nothing else."""
    bw, o = hw.hbm_bytes_per_s * hw.memory_efficiency, hw.kernel_overhead_s
    m, n, k, tp = 8192, 16384, 2048, 8
    proj = _gemm("out_proj", m, n, k)
    f, b = fp8_cast_s(hw, proj, "delayed", tp, True)
    assert f == pytest.approx(4 * m * k / bw + o)
    assert b == pytest.approx((3 * m * n / tp + 2 * m * n) / bw + 2 * o)
    assert b < 4 * m * n / bw  # cheaper than the cast over the gathered tensor
    # no sequence parallelism, or a column-parallel GEMM: one cast-transpose, as before
    for op, tp_, sp in ((proj, tp, False), (proj, 1, True), (_gemm("qkv", m, n, k), tp, True)):
        f, b = fp8_cast_s(hw, op, "delayed", tp_, sp)
        assert (f, b) == pytest.approx((4 * m * k / bw + o, 4 * m * n / bw + o))
    # blockwise / mxfp8 scale inside the cast: priced as delayed
    assert fp8_cast_s(hw, proj, "mxfp8", tp, True) == fp8_cast_s(hw, proj, "delayed", tp, True)


def test_current_scaling_adds_amax_passes_and_scale_kernels_on_a_405b_layer_by_hand(hw):
    """Llama-3.1 405B block at tp 8 (sp), cp 2, mbs 1 (the Megatron-Bridge 25.11 row's shape):
    current scaling adds, per layer, in forward the amax passes over the out-projection and
    MLP-down inputs (2 T h / t + 2 T f / t bytes), in backward the amax passes over the four
    output gradients (QKV 2 T (h + 2 h_kv) / t, gate-up 4 T f / t, the two row-parallel ones over
    their sequence shard, 2 T h / t each). Launches, counted from TE's code: a quantization that
    computes its amax runs zero_amax_kernel, the amax kernel, the scale kernel (and the cast,
    which delayed scaling runs too); a norm-fed one (QKV, MLP-up inputs) amax.zero_() and the
    scale kernel: forward 2 x 3 + 2 x 2 = 10, backward 4 x 3 = 12."""
    m = load_model("llama3_405b")
    t, cp = 8, 2
    h, hkv, f = m.hidden_size, m.kv_hidden_size, m.ffn_hidden_size
    T = m.seq_len / cp
    bw, o = hw.hbm_bytes_per_s * hw.memory_efficiency, hw.kernel_overhead_s
    v = Variant(t, True, 1, cp)
    cost = block_cost(m, 1, v)
    delayed = layer_times(hw, cost, None, "fp8", fp8_recipe="delayed", variant=v)
    current = layer_times(hw, cost, None, "fp8", fp8_recipe="tensorwise", variant=v)
    add_f = (2 * T * h / t + 2 * T * f / t) / bw + 10 * o
    add_b = (2 * T * (h + 2 * hkv) / t + 4 * T * f / t + 4 * T * h / t) / bw + 12 * o
    assert current.fwd_s - delayed.fwd_s == pytest.approx(add_f, rel=1e-9)
    assert current.bwd_s - delayed.bwd_s == pytest.approx(add_b, rel=1e-9)
    # full recomputation re-runs the forward's quantizations too
    assert (current.recompute_s["full"] - delayed.recompute_s["full"]
            == pytest.approx(add_f, rel=1e-9))
    assert 0.005 < (add_f + add_b) / (delayed.fwd_s + delayed.bwd_s) < 0.03  # ~1% of the layer
    assert amax_reductions(cost, "tensorwise", t, True) == (2, 2)
    assert amax_reductions(cost, "delayed", t, True) == (0, 0)
    assert amax_reductions(cost, "tensorwise", t, False) == (0, 0)


def test_amax_all_reduces_priced_on_the_tp_group_and_only_under_current_scaling():
    """The Megatron-Bridge Llama-3 70B example (tp 4 sp, interleaved, FP8 current scaling):
    device group 0 holds 10 blocks in its 5 chunks, so 20 forward and 20 backward all-reduces of
    one fp32 amax on its tp group, each lines_time(all_reduce lines, 4 bytes); not hidden by the
    userbuffers overlap; absent under delayed scaling, which (without the overlap, whose exposed
    share reads the GEMM times, casts included) prices the stage's communication alike."""
    plan, pr = load_plan(EXAMPLE)
    ids = [s.device_ids for s in plan.stages]
    blocks = sum(pr.graph.layers[i].kind == "block" for s in plan.stages if s.device_ids == ids[0]
                 for i in range(s.first_layer, s.last_layer + 1))
    assert blocks == 10
    tp = inner_groups(np.asarray(ids[0]), plan.tp, 1, 1, plan.dp)["tp"]
    one = float(lines_time(group_lines(pr.cluster, "all_reduce", tp), AMAX_BYTES))
    assert one > 0
    for overlap in (False, True):
        p = pr.with_training(pr.training.with_(tp_comm_overlap=overlap))
        bd = evaluate(plan, p).stages[0].breakdown_s
        amax = {k: x for k, x in bd.items() if k.startswith("tp_amax_all_reduce.")}
        assert sum(amax.values()) == pytest.approx(4 * blocks * one)
        delayed = p.with_training(p.training.with_precision({"fp8_recipe": "delayed"}))
        bd_d = evaluate(plan, delayed).stages[0].breakdown_s
        assert not any(k.startswith("tp_amax") for k in bd_d)
        if not overlap:
            assert {k: x for k, x in bd.items() if k in bd_d and not k.startswith("compute")} \
                == pytest.approx({k: x for k, x in bd_d.items() if not k.startswith("compute")})
        assert bd["compute_fwd"] > bd_d["compute_fwd"] and bd["compute_bwd"] > bd_d["compute_bwd"]


def test_amax_zeroing_is_one_launch_per_quantized_tensor_on_a_moe_layer(hw, monkeypatch):
    """Mixtral-8x7B's block at ep 4 (2 local experts), FP8 current scaling: TE quantizes, per
    micro-batch, the QKV and out-projection inputs and each local expert's fc1 and fc2 inputs
    in forward (2 + 2 x 2 = 6 tensors; the router stays BF16) and their output gradients in
    backward (6 more), and each quantization first zeroes its amax (zero_amax_kernel or
    amax.zero_()). Without the zeroing (ZERO_AMAX_KERNELS = 0) the layer is exactly 6 launches
    shorter in each phase; delayed scaling has no amax to zero."""
    import nest.costs.fp8_quant as fq

    v = Variant(ep=4)
    cost = block_cost(load_model("mixtral_8x7b", seq_len=4096), 1, v)
    local = [op.count for op in cost.ops if op.name == "expert_gate_up"]
    assert local == [2]
    bare = replace_hw(hw)
    with_zero = layer_times(bare, cost, None, "fp8", fp8_recipe="tensorwise", variant=v)
    delayed = layer_times(bare, cost, None, "fp8", fp8_recipe="delayed", variant=v)
    monkeypatch.setattr(fq, "ZERO_AMAX_KERNELS", 0)
    without = layer_times(bare, cost, None, "fp8", fp8_recipe="tensorwise", variant=v)
    assert with_zero.fwd_s - without.fwd_s == pytest.approx(6 * hw.kernel_overhead_s, rel=1e-9)
    assert with_zero.bwd_s - without.bwd_s == pytest.approx(6 * hw.kernel_overhead_s, rel=1e-9)
    assert layer_times(bare, cost, None, "fp8", fp8_recipe="delayed", variant=v) == delayed


def replace_hw(hw):
    """The hardware without its host floor, so the layer time is the GPU's sum."""
    from dataclasses import replace

    return replace(hw, host_fwd_s_per_op=0.0, host_bwd_s_per_op=0.0)
