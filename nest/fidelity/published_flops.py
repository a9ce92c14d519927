"""Published runs' FLOP conventions (Korthikanti / Narayanan / NeMo / Megatron-Bridge) -> FLOPs per batch.

The formulas the sources of config/validation/published_runs.yaml use to turn a step time into
TFLOP/s per GPU or MFU (nest.fidelity.published_runs converts back with the row's `flops:` name).
"""

from __future__ import annotations

from nest.common.errors import SpecError
from nest.spec.catalog import ModelSpec

# FLOP formulas of the sources (per global batch). B: sequences, s: sequence, l: layers, h: hidden,
# V: vocabulary, a: heads, g: key/value heads, f: FFN hidden size.
# --------------------------------------------------------------------------------------------


def megatron_model_flops(m: ModelSpec, batch: int, seq: int, vocab: int | None = None) -> float:
    """Korthikanti et al. 2022 (section 6): model FLOPs per iteration 72 B s l h^2 (1 + s/6h +
    V/12lh), i.e. Narayanan et al. 2021's 96 B s l h^2 (1 + s/6h + V/16lh) without the recomputed
    forward pass (3 passes, not 4; the logit GEMM is never recomputed). Full s x s attention."""
    b, s, l, h, v = batch, seq, m.num_layers, m.hidden_size, vocab or m.vocab_size
    return 72 * b * s * l * h**2 * (1 + s / (6 * h) + v / (12 * l * h))


def nemo_flops(m: ModelSpec, batch: int, seq: int, vocab: int | None = None,
               causal_half: bool = False) -> float:
    """NeMo's "Model TFLOP/sec/GPU" formulas (NVIDIA/NeMo nemo/utils/flops_formulas.py):
    GPT-3 (GELU MLP, f = 4h): (24 B s h^2 + 4 B s^2 h c) 3 l + 6 B s h V;
    Llama (SwiGLU): B s l h^2 (12 + 12 g/a + 18 f/h + 12 (s/h) c + 6 V/(l h));
    MoE (routed SwiGLU experts): Megatron-Bridge's formula, `_moe_flops`;
    c = 1/2 when causal attention counts half (Megatron-Bridge 25.x), 1 in NeMo 24.07's tables."""
    b, s, l, h, v = batch, seq, m.num_layers, m.hidden_size, vocab or m.vocab_size
    c = 0.5 if causal_half else 1.0
    if m.ffn_type == "gelu":
        return (24 * b * s * h * h + 4 * b * s * s * h * c) * 3 * l + 6 * b * s * h * v
    if m.ffn_type != "swiglu":
        raise SpecError(f"{m.source_file}: key 'ffn_type': no NeMo FLOP formula for {m.ffn_type}")
    if m.is_moe:
        return _moe_flops(m, b, s, v, c)
    g, a, f = m.num_kv_heads, m.num_heads, m.ffn_hidden_size
    return b * s * l * h * h * (12 + 12 * g / a + 18 * f / h + 12 * s / h * c + 6 * v / (l * h))


def _moe_flops(m: ModelSpec, b: int, s: int, v: int, c: float) -> float:
    """Megatron-Bridge's MoE "Model TFLOP/sec/GPU" (src/megatron/bridge/training/utils/
    flop_utils.py, transformer_flops, GQA branch): per token 3 x 2 x [h (q + 2 kv) + q h
    (projections) + q s c (QK^T and AV: 2 x q s c, c = 1/2 when causal half) ] per layer +
    3 x 2 x 3 h f k (the k routed SwiGLU experts; the router is not counted) + 3 x 2 h V,
    with q = heads x head_dim, kv = kv_heads x head_dim. Refuses what that branch prices
    differently (sliding windows, shared experts, dense first blocks, MLA)."""
    if m.sliding_window or m.shared_ffn_hidden_size or m.num_dense_layers or m.is_mla:
        raise SpecError(f"{m.source_file}: the MoE FLOP formula here covers uniform GQA MoE "
                        "blocks only (no sliding window, shared expert, dense blocks or MLA)")
    h, l, f, k = m.hidden_size, m.num_layers, m.ffn_hidden_size, m.top_k
    q, kv = m.q_hidden_size, m.kv_hidden_size
    per_layer = 6 * (h * (q + 2 * kv) + q * h + 2 * q * s * c) + 6 * 3 * h * f * k
    return b * s * (l * per_layer + 6 * h * v)


def megatron_hardware_flops(m: ModelSpec, batch: int, seq: int, vocab: int | None = None
                            ) -> float:
    """Narayanan et al. 2021 (SC21), Eq. 3: 96 B s l h^2 (1 + s/6h + V/16lh), the GEMM FLOPs of
    an iteration with full activation recomputation (the extra forward pass counted), which is
    how their Table 1 and Table 2 count "achieved teraFLOP/s per GPU"."""
    b, s, l, h, v = batch, seq, m.num_layers, m.hidden_size, vocab or m.vocab_size
    return 96 * b * s * l * h**2 * (1 + s / (6 * h) + v / (16 * l * h))


FLOP_FORMULAS = {
    "megatron_model": megatron_model_flops,
    "megatron_hardware": megatron_hardware_flops,
    "nemo_noncausal": lambda m, b, s, v=None: nemo_flops(m, b, s, v, causal_half=False),
    "nemo_causal": lambda m, b, s, v=None: nemo_flops(m, b, s, v, causal_half=True),
}
