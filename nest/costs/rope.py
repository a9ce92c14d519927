"""Rotary position embedding run by eager PyTorch instead of the fused kernel: the extra
operator a run pays when Megatron-Core falls back from its fused RoPE (used by
nest.costs.table.layer_times; TrainingSettings.rope_fusion false).

Megatron-Core's apply_rotary_pos_emb (megatron/core/models/common/embeddings/rope_utils.py)
calls Transformer Engine's fused_apply_rotary_pos_emb under apply_rope_fusion, except, from
megatron-core 0.16 (9ed8b0c) on, when the YaRN concentration factor `mscale` is not 1 ("mscale
... is not supported by TE's fused RoPE. Using unfused implementation."). gpt-oss is such a
model: YaRN factor 32 with yarn_mscale unset gives 0.1 ln 32 + 1 = 1.35
(_yarn_get_concentration_factor, yarn_rotary_pos_embedding.py). core_v0.15.0 has no such check
and runs the fused kernel; Megatron-Bridge v0.2.0 (the 25.11 release) already pins 0.16.0rc0
(Megatron-LM 0d8e0714), which has it. The layer graph prices the fused
kernel (its `rope` operator: one read and one write of Q and K); the eager path
_apply_rotary_pos_emb_bshd, applied to Q and to K separately, runs per tensor t of |t| bytes
(seq s, head dim d; freqs [s, 1, 1, d] FP32):

  forward: cos, * mscale, .to(bf16) and sin, * mscale, .to(bf16) on freqs (22 s d bytes each),
           t * cos_ (2 |t| + 2 s d), -x2 (|t|), cat (2 |t|), * sin_ (2 |t| + 2 s d), + (3 |t|),
           cat((t, t_pass)) (2 |t|): 12 kernels, 12 |t| + 48 s d bytes;
  backward: g * sin_ (2 |t| + 2 s d), -g (|t|), the chunk's cat (2 |t|), g * cos_ (2 |t| + 2 s d),
           the two products' sum (3 |t|), the empty t_pass slice's zero gradient (|t|) and its
           sum (3 |t|): 7 kernels, 14 |t| + 4 s d bytes

(the aten calls as PyTorch dispatches them: tests/test_rope_unfused.py), against the fused
kernel's 1 kernel and 2 |t| bytes each way.
"""

from __future__ import annotations

from nest.costs.profiled import BYTES  # BF16 Q and K, as in the layer graph
from nest.graph.layer_graph import LayerCost, Op

ROPE_UNFUSED = "rope_unfused"
FREQ_BYTES_FWD = 48  # per s x d element of the frequency table, per tensor
FREQ_BYTES_BWD = 4
T_BYTES_FWD, T_BYTES_BWD = 12, 14  # per byte of the tensor (the eager path)
FUSED_T_BYTES = 2  # the fused kernel: one read, one write
EAGER_FWD_KERNELS = 12


def rope_unfused_op(cost: LayerCost, unfused: bool) -> tuple[Op, ...]:
    """() unless `unfused` and the layer has rotary embeddings (its `rope` operator) and a
    fused attention operator (`attention`, shape (b, heads, s, s_kv, d); its K / V heads read
    from its bytes as in nest.costs.profiled); else one memory-bound op with the eager path's
    bytes less the fused kernel's for Q and K (module docstring), in 22 calls per phase (2 x the
    12 forward kernels less the fused one; the backward's 12 extra priced as 22 launches and host
    calls: its autograd nodes, about 8 per tensor, are closer to the forward's count)."""
    if not unfused or not any(op.name == "rope" for op in cost.ops):
        return ()
    att = [op for op in cost.ops if op.name == "attention" and op.kind == "attention"]
    if not att:
        return ()
    a = att[0]
    b, heads, s, s_kv, d = a.shape
    kv = (a.fwd_bytes / BYTES - 2.0 * b * s * heads * d) / (2.0 * b * s_kv * d)
    t = BYTES * b * s * (heads + kv) * d  # |Q| + |K|
    sd = 2 * s * d  # one frequency table per tensor, Q and K
    fwd = (T_BYTES_FWD - FUSED_T_BYTES) * t + FREQ_BYTES_FWD * sd
    bwd = (T_BYTES_BWD - FUSED_T_BYTES) * t + FREQ_BYTES_BWD * sd
    n = 2 * (EAGER_FWD_KERNELS - 1)
    return (Op(ROPE_UNFUSED, "memory", 0.0, 0.0, fwd / n, bwd / n, (), n),)
