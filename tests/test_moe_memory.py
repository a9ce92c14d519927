"""What an MoE block keeps for backward, counted by hand from Megatron-Core's MoE layer and
checked against the traced layer graph (nest.graph.torch_models.MoE).

Megatron-Core >= 0.13 (every published MoE row ran 0.14 or later) applies the routing weights
inside the experts' activation (TEGroupedMLP.bias_act_func -> weighted_bias_swiglu_impl, whose
WeightedSwiGLUFunction saves its input and the weights) and unpermutes without them, so no
expert output is kept for the weights' gradient; the graph counted one [T k, h] BF16 tensor for
it until the MoE block applied the weights in the activation."""

import dataclasses

import pytest

from nest.graph import build_graph
from nest.graph import fx_extract as fx
from nest.graph.fp8 import saved_input_change
from nest.graph.layer_graph import Variant
from nest.spec.catalog import load_model


def _by_hand(m, b: int) -> int:
    """Saved-for-backward bytes of one mixtral_mini block (no recomputation, the unfused
    Korthikanti attention core of the raw trace), micro-batch b, any ep (balanced routing)."""
    h, s, E, k, f = m.hidden_size, m.seq_len, m.num_experts, m.top_k, m.ffn_hidden_size
    a, kv, d = m.num_heads, m.num_kv_heads, m.head_dim
    T = b * s
    attention = (2 * T * h + 4 * T          # norm1: its BF16 input + fp32 rstd per token
                 + 2 * T * h                # qkv: its input (norm1's output)
                 + 2 * T * (a + 2 * kv) * d  # the core: packed Q, K, V ...
                 + 2 * a * s * s * b        # ... and the softmax probabilities (no dropout)
                 + 2 * T * h)               # out_proj: its input, the attention output
    moe = (2 * T * h + 4 * T                # norm2: input + rstd
           + 2 * T * h                      # router: its input (norm2's output)
           + 4 * T * E + 8 * T * k + 4 * T * k + 4 * T  # fp32 softmax, top-k ids, weights, sum
           + 2 * 8 * T * k                  # permute: token and weight gather indices (int64)
           + 2 * T * k * h                  # expert_gate_up: the dispatched tokens
           + 2 * T * k * 2 * f + 2 * T * k  # weighted SwiGLU: its input and the weights
           + 2 * T * k * f                  # expert_down: the activation's output
           + 8 * T * k)                     # combine: the un-permute index only
    return attention + moe


@pytest.mark.parametrize("ep", [1, 4])
def test_moe_block_saved_bytes_by_hand(ep):
    m = load_model("mixtral_mini")
    traced = fx.trace_layer(m, "block", Variant(1, False, ep), mbs=1).cost.act_bytes["none"]
    assert traced == _by_hand(m, 1)


def test_moe_block_saved_bytes_derived_batch_and_fp8():
    """The graph's block at micro-batch 2 (derived from the batch-tagged trace, nest.graph.
    fx_batch) holds the same count; FP8 keeps the experts' GEMM inputs at 1 B per element
    (Transformer Engine's GroupedLinear saves the quantised input): T k (h + f) bytes less."""
    m = load_model("mixtral_mini")
    v = Variant(1, False, 4)
    cost = build_graph(m, 2).layers[1].costs[v.key]
    assert cost.act_bytes["none"] == _by_hand(m, 2)
    T, k = 2 * m.seq_len, m.top_k
    expert = tuple(op for op in cost.ops if op.name.startswith("expert_"))
    delta = saved_input_change(dataclasses.replace(cost, ops=expert), v, "flash")
    assert delta == -T * k * (m.hidden_size + m.ffn_hidden_size)
