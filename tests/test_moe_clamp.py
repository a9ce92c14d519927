"""The experts' GLU input clamp (gpt-oss; nest.costs.moe_time.moe_expert_clamp_op) and the
module recomputation that re-runs it (nest.costs.table.MODULE_RECOMPUTE): the kernels
and bytes of Megatron-Core's eager clamp expression, counted another way (every aten call
PyTorch dispatches for its forward and backward, logged and summed tensor by tensor), and the
op's place in a layer's time."""

from dataclasses import replace

import pytest
import torch
from aten_bytes import AtenLog

from nest.costs.moe_time import (CLAMP_BWD_BYTES, CLAMP_FWD_BYTES, CLAMP_FWD_KERNELS,
                                 EXPERT_CLAMP, busiest_rank_ops, moe_expert_clamp_op)
from nest.costs.table import layer_times
from nest.graph.layer_graph import Variant
from nest.spec.catalog import load_hardware, load_model

def _megatron_clamp(x, c=7.0):
    """megatron/core/fusions/fused_bias_geglu.py, weighted_bias_quick_geglu_impl's clamp."""
    x_glu, x_linear = x.chunk(2, -1)
    return torch.cat((x_glu.clamp(min=None, max=c), x_linear.clamp(min=-c, max=c)), -1)


def test_clamp_kernels_and_bytes_as_pytorch_dispatches_them():
    """Forward 3 kernels moving 4 |x|, backward 7 kernels moving 7.5 |x| (|x|: the fc1
    output's bytes), from the aten calls themselves."""
    x = torch.randn(96, 64, dtype=torch.bfloat16, requires_grad=True)
    size = x.numel() * x.element_size()
    fwd, bwd = AtenLog(), AtenLog()
    with fwd:
        y = _megatron_clamp(x)
    g = torch.randn_like(y)
    with bwd:
        y.backward(g)
    assert len(fwd.calls) == CLAMP_FWD_KERNELS == 3
    assert fwd.nbytes == CLAMP_FWD_BYTES * size
    assert len(bwd.calls) == 7, bwd.calls
    assert bwd.nbytes == CLAMP_BWD_BYTES * size


@pytest.fixture(scope="module")
def mixtral_ep4():
    from nest.graph.fx_extract import build_layer_graph_fx

    g = build_layer_graph_fx(load_model("mixtral_mini"), 1, [Variant(ep=4)])
    return next(la.costs[Variant(ep=4).key] for la in g.layers
                if any(op.name == "moe_route" for op in la.costs[Variant(ep=4).key].ops))


def test_clamp_op_sizes_from_the_fc1_output(mixtral_ep4):
    """mixtral_mini at ep 4 (h 1,024, f 3,584, seq 1,024, top-2, 2 local experts): the fc1
    output is 2,048 received tokens x 2 f BF16 values; the op moves 4 / 7.5 times that in 3 calls
    per phase, is absent without a clamp, runs on the busiest rank, and lengthens the layer by
    its roofline time exactly (host floor off)."""
    from nest.costs.roofline import elementwise_efficiency

    m = load_model("mixtral_mini")
    assert moe_expert_clamp_op(mixtral_ep4, False) == ()
    op, = moe_expert_clamp_op(mixtral_ep4, True)
    x = 2 * 2048 * 2 * m.ffn_hidden_size
    assert op.name == EXPERT_CLAMP and op.kind == "memory" and op.count == 3
    assert op.count * op.fwd_bytes == pytest.approx(4 * x)
    assert op.count * op.bwd_bytes == pytest.approx(7.5 * x)
    assert EXPERT_CLAMP in busiest_rank_ops(mixtral_ep4, (*mixtral_ep4.ops, op))
    hw = replace(load_hardware("h100_sxm"), host_fwd_s_per_op=0.0, host_bwd_s_per_op=0.0)
    bw = hw.hbm_bytes_per_s * elementwise_efficiency(hw)
    plain = layer_times(hw, mixtral_ep4, None, moe_padded=True)
    clamped = layer_times(hw, mixtral_ep4, None, moe_padded=True, expert_clamp=True)
    for phase, nbytes in (("fwd_s", 4 * x), ("bwd_s", 7.5 * x)):
        assert getattr(clamped, phase) - getattr(plain, phase) == pytest.approx(
            nbytes / bw + 3 * hw.kernel_overhead_s, rel=1e-9)


def test_gpt_oss_states_its_clamp_and_only_it():
    """gpt-oss's Hugging Face config (swiglu_limit 7.0) and the validation model file carry the
    clamp; Mixtral (the default run's MoE model) has none, so its cost table prices no clamp."""
    from nest.graph.hf_spec import model_spec_from_hf_config

    assert model_spec_from_hf_config("tests/fixtures/hf/gpt_oss_20b.json", seq_len=4096).glu_clamp == 7.0
    assert load_model("config/validation/models/gpt_oss_120b.yaml").glu_clamp == 7.0
    assert load_model("mixtral_8x7b").glu_clamp == 0.0


def test_module_recompute_reruns_the_norms_and_the_experts_activation(mixtral_ep4):
    """Megatron-Core's recompute_modules [layernorm, moe_act] (gpt-oss's H100 preset): the
    backward grows by the forward of norm1, norm2, the experts' activation and their clamp,
    each priced as in the layer's own forward (host floor off); the forward is unchanged;
    `layernorm` alone re-runs the norms only."""
    from nest.costs.profiled import price_op
    from nest.costs.table import MODULE_RECOMPUTE, module_recompute_ops

    hw = replace(load_hardware("h100_sxm"), host_fwd_s_per_op=0.0, host_bwd_s_per_op=0.0)
    clamp, = moe_expert_clamp_op(mixtral_ep4, True)
    ops = {op.name: op for op in (*mixtral_ep4.ops, clamp)}
    fwd = {n: price_op(hw, op, None).fwd_s for n, op in ops.items()}
    base = layer_times(hw, mixtral_ep4, None, moe_padded=True, expert_clamp=True)
    for mods, names in ((("layernorm", "moe_act"),
                         ("norm1", "norm2", EXPERT_CLAMP, "expert_swiglu")),
                        (("layernorm",), ("norm1", "norm2"))):
        assert sorted(module_recompute_ops(mods, fwd)) == sorted(names)
        t = layer_times(hw, mixtral_ep4, None, moe_padded=True, expert_clamp=True,
                        recompute_modules=mods)
        assert t.fwd_s == base.fwd_s
        assert t.bwd_s - base.bwd_s == pytest.approx(sum(fwd[n] for n in names), rel=1e-12)
    assert set(MODULE_RECOMPUTE) == {"layernorm", "moe_act", "act"}
    assert module_recompute_ops(("act",), fwd) == ()  # an MoE layer has no dense activation


def test_recompute_modules_setting_reaches_the_cost_table_only_where_stated():
    """Default settings recompute no module (the default run unchanged); both gpt-oss rows
    state their preset's [layernorm, moe_act]; a bad value is refused naming the key."""
    from nest.common.errors import SpecError
    from nest.fidelity.published_runs import load_runs, problem_for, training_for
    from nest.spec.settings import load_training

    assert load_training().recompute_modules == ()
    rows = {r["id"]: r for r in load_runs()}
    for rid in ("bridge260401_gpt_oss_120b_64gpu_bf16", "bridge2511_gpt_oss_120b_64gpu_bf16"):
        assert training_for(rows[rid]).recompute_modules == ("layernorm", "moe_act")
    assert problem_for(rows["bridge260401_gpt_oss_120b_64gpu_bf16"]).costs.recompute_modules \
        == ("layernorm", "moe_act")
    assert training_for(rows["bridge260401_qwen3_30b_a3b_16gpu_fp8"]).recompute_modules == ()
    with pytest.raises(SpecError, match="recompute_modules"):
        training_for(dict(rows["bridge2511_gpt_oss_120b_64gpu_bf16"], recompute_modules=["mlp"]))
