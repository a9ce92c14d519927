"""Model spec -> layer graph from closed-form transformer formulas (all sub-graph variants).

The first-cut graph builder and, once torch.fx tracing lands, its cross-check. Conventions:

* bf16 tensors (2 bytes). Per device, per micro-batch of b sequences of s tokens.
* Sub-graph variant (t, sp, e, c): Megatron tensor parallelism over t devices (column/row split;
  Shoeybi et al. 2019, section 3), sequence parallelism (Korthikanti et al. 2022, section 4.2.2),
  expert parallelism over e devices that also act as data parallel for the dense part (Megatron-LM
  MoE: EP is carved from the data-parallel ranks; each of the e ranks runs its own micro-batch),
  context parallelism over c devices (each holds s/c tokens; K/V gathered around the ring).
* Attention FLOPs: a causal model runs flash kernels that skip fully masked blocks, so its score
  and value matmuls count half of the full s x s work (FlashAttention-2, Dao 2023, section 3.1;
  the same convention as Megatron-LM's MFU accounting since 2023 and PaLM's appendix B uses full).
  BERT (bidirectional) counts the full s x s.
* Backward FLOPs = 2 x forward for every matmul (one GEMM for the input gradient, one for the
  weight gradient; Kaplan et al. 2020, section 2.1). Attention core likewise (scores saved).
* Elementwise / norm operators carry HBM bytes and no FLOPs (they are bandwidth-bound; their few
  FLOPs per element are below 1% of a block's total).
* Activation memory follows Korthikanti et al. 2022, section 4.1: s*b*h*(34 + 5*a*s/h) bytes per
  GPT layer, generalised term by term to grouped-query attention, SwiGLU and MoE experts.
"""

from __future__ import annotations

from nest.graph.layer_graph import Collective, Layer, LayerCost, LayerGraph, Op, Variant
from nest.common.errors import SpecError
from nest.spec.catalog import ModelSpec

BYTES = 2  # bf16


def variants_of(model: ModelSpec) -> list[Variant]:
    """Every (tp, sp, ep, cp) the model declares, the unsplit variant first. sp applies where
    there is a tensor-parallel group to split the sequence over: with tp = 1 a declared
    sp: [true] stands for the same layout without it (Megatron-LM refuses --sequence-parallel
    with tp 1), so tp = 1 with expert or context parallelism stays in the space."""
    pv = model.parallel_variants
    out = [Variant()]
    for t in pv.tp:
        for sp in pv.sp:
            for e in pv.ep:
                for c in pv.cp:
                    v = Variant(t, sp and t > 1, e, c)
                    if v not in out:
                        out.append(v)
    return out


def _matmul(name: str, m: float, n: float, k: float, count: int = 1) -> Op:
    flops = 2.0 * m * n * k
    io = BYTES * (m * k + k * n + m * n)
    # backward: dX = dY W^T and dW = X^T dY, each reading two operands and writing one
    return Op(name, "matmul", flops, 2 * flops, io, 2 * io, (int(m), int(n), int(k)), count)


def _memory(name: str, fwd_elems: float, bwd_elems: float) -> Op:
    return Op(name, "memory", 0.0, 0.0, BYTES * fwd_elems, BYTES * bwd_elems)


# --------------------------------------------------------------------------------------------
# Parameter counts (unsharded), closed form
# --------------------------------------------------------------------------------------------


def _has_bias(m: ModelSpec) -> bool:
    return m.family in ("bert", "gpt")


def norm_params(m: ModelSpec) -> int:
    return 2 * m.hidden_size if m.norm == "layernorm" else m.hidden_size


def attention_params(m: ModelSpec) -> int:
    h, hkv = m.hidden_size, m.kv_hidden_size
    w = h * (h + 2 * hkv) + h * h
    return w + ((h + 2 * hkv) + h if _has_bias(m) else 0)


def ffn_params(m: ModelSpec) -> int:
    h, f = m.hidden_size, m.ffn_hidden_size
    if m.ffn_type == "gelu":
        return 2 * h * f + ((f + h) if _has_bias(m) else 0)
    return 3 * h * f  # SwiGLU: gate, up, down (no biases in Llama / Mixtral)


def block_params(m: ModelSpec) -> int:
    mlp = m.num_experts * ffn_params(m) + (m.hidden_size * m.num_experts if m.is_moe else 0)
    return attention_params(m) + mlp + 2 * norm_params(m)


def embedding_params(m: ModelSpec) -> int:
    p = m.vocab_size * m.hidden_size
    if m.learned_positions:
        p += m.seq_len * m.hidden_size
    if m.family == "bert":
        p += 2 * m.hidden_size + norm_params(m)  # token-type embeddings + embedding LayerNorm
    return p


def head_params(m: ModelSpec) -> int:
    """Final norm + LM head (+ BERT's MLM transform). A tied head reuses the embedding matrix."""
    h = m.hidden_size
    p = norm_params(m) if m.family != "bert" else 0
    if m.family == "bert":
        p += h * h + h + norm_params(m) + m.vocab_size  # MLM dense + LayerNorm + decoder bias
    if not m.tied_embeddings:
        p += m.vocab_size * h
    return p


# Features of Hugging Face families that only the traced modules (torch_fx) model.
_FX_ONLY = ("head_size", "qkv_bias", "qk_norm", "sandwich_norm", "sliding_window",
            "final_softcap", "shared_ffn_hidden_size", "num_dense_layers", "kv_lora_rank",
            "qk_norm_full", "linear_bias", "attention_sinks", "mtp_layers")


def check_supported(m: ModelSpec) -> None:
    """A SpecError naming the model's features this closed form does not price."""
    used = [k for k in _FX_ONLY if getattr(m, k)] + (["ffn_type=geglu"] if m.ffn_type == "geglu"
                                                      else []) + ([] if m.pre_norm else
                                                                  ["pre_norm=false"])
    if used:
        raise SpecError(f"{m.source_file or m.name}: the closed-form graph does not model "
                        f"{', '.join(used)}; build it with graph_source torch_fx")


def total_params(m: ModelSpec) -> int:
    check_supported(m)
    return embedding_params(m) + m.num_layers * block_params(m) + head_params(m)


# --------------------------------------------------------------------------------------------
# Per-variant layer costs
# --------------------------------------------------------------------------------------------


def _tp_collectives(phase: str, v: Variant, nbytes: float, n: int) -> list[Collective]:
    """n Megatron f/g operators: all-reduce, or all-gather + reduce-scatter with sp (same volume)."""
    if v.tp == 1:
        return []
    if v.sp:
        return [Collective("all_gather", phase, "tp", nbytes, n),
                Collective("reduce_scatter", phase, "tp", nbytes, n)]
    return [Collective("all_reduce", phase, "tp", nbytes, n)]


def block_cost(m: ModelSpec, b: int, v: Variant) -> LayerCost:
    t, c = v.tp, v.cp
    h, hkv, f, a = m.hidden_size, m.kv_hidden_size, m.ffn_hidden_size, m.num_heads
    s = m.seq_len
    s_loc = s / c  # tokens of one sequence held by this device (context parallel)
    T = b * s_loc  # tokens per device
    T_norm = T / t if v.sp else T  # elementwise ops run on the sequence shard with sp
    drop = 1.0 if m.has_dropout else 0.0
    causal = 0.5 if m.causal else 1.0

    ops = [_memory("norm1", 2 * T_norm * h, 3 * T_norm * h)]
    ops.append(_matmul("qkv", T, (h + 2 * hkv) / t, h))
    att_flops = 4.0 * b * (a / t) * s_loc * s * m.head_dim * causal  # QK^T and AV
    att_io = BYTES * (2 * T * h / t + 2 * b * s * hkv / t)  # read Q, K, V; write O (flash-style)
    ops.append(Op("attention", "attention", att_flops, 2 * att_flops, att_io, 2 * att_io,
                  (b, a // t, int(s_loc), s, m.head_dim)))
    ops.append(_matmul("out_proj", T, h, h / t))
    ops.append(_memory("residual1", 3 * T_norm * h, 2 * T_norm * h))
    ops.append(_memory("norm2", 2 * T_norm * h, 3 * T_norm * h))
    expert_params = 0.0
    if m.is_moe:
        k, E, e = m.top_k, m.num_experts, v.ep
        ops.append(_matmul("router", T, E, h))
        tok_e = T * k * e / E  # tokens per local expert, balanced routing
        ops.append(_matmul("expert_gate_up", tok_e, 2 * f / t, h, count=E // e))
        ops.append(_memory("expert_swiglu", 3 * T * k * f / t, 5 * T * k * f / t))
        ops.append(_matmul("expert_down", tok_e, h, f / t, count=E // e))
        expert_params = (E // e) * ffn_params(m) / t
        mlp_dense = h * E  # router, replicated
        mlp_act_split = 6 * T * k * f  # gate, up, product of the experts' SwiGLU (2 B each)
        # router input, dispatched inputs (2 B each), the routing weights the experts' weighted
        # activation keeps (2 B per token copy; Megatron-Core >= 0.13 applies them there, so no
        # expert output is kept for their gradient: torch_models._WeightedGLU), fp32 router
        # probabilities (measured by the torch.fx extraction)
        mlp_act_repl = 2 * T * h + 2 * T * k * h + 2 * T * k + 4 * T * E
    elif m.ffn_type == "swiglu":
        ops.append(_matmul("mlp_gate_up", T, 2 * f / t, h))
        ops.append(_memory("swiglu", 3 * T * f / t, 5 * T * f / t))
        ops.append(_matmul("mlp_down", T, h, f / t))
        mlp_dense = ffn_params(m) / t
        mlp_act_split = 6 * T * f  # gate out, up out, product (Korthikanti-style, 2 B each)
        mlp_act_repl = 2 * T * h  # input of the first linear
    else:
        ops.append(_matmul("mlp_up", T, f / t, h))
        ops.append(_memory("gelu", 2 * T * f / t, 3 * T * f / t))
        ops.append(_matmul("mlp_down", T, h, f / t))
        # biases of the row-parallel down projection are replicated
        mlp_dense = (2 * h * f + f) / t + h if _has_bias(m) else 2 * h * f / t
        mlp_act_split = 4 * T * f  # GeLU input and fc2 input: Korthikanti's 8sbh + 8sbh at f=4h
        mlp_act_repl = 2 * T * h
    ops.append(_memory("residual2", 3 * T_norm * h, 2 * T_norm * h))

    attn_dense = (h * (h + 2 * hkv) + h * h + ((h + 2 * hkv) if _has_bias(m) else 0)) / t
    attn_dense += h if _has_bias(m) else 0  # out-proj bias, replicated
    dense_params = attn_dense + mlp_dense + 2 * norm_params(m)

    # Activation bytes saved for backward (Korthikanti et al. 2022, section 4.1, Eq. 1-2):
    # replicated across tp unless sp: norm inputs 4sbh, QKV input 2sbh, MLP input 2sbh,
    # two dropout masks 2sbh -> "10 sbh"; split by tp: Q,K,V and out-proj input (8sbh at GQA=1),
    # MLP internals (16sbh for GeLU at f=4h) -> "24 sbh"; attention scores 5as^2b (split by tp).
    repl = 4 * T * h + 2 * T * h + mlp_act_repl + 2 * drop * T * h
    split = 2 * T * h + 4 * T * hkv + 2 * T * h + mlp_act_split
    scores = (2 + 3 * drop) * a * s_loc * s * b  # softmax out (2), dropout mask (1), output (2)
    act_none = (repl / t if v.sp else repl) + split / t + scores / t
    act_sel = act_none - scores / t  # selective recomputation drops the s^2 terms (section 5)
    act_full = 2 * T * h / (t if v.sp else 1)  # only the layer input is kept (section 4.3)
    names = tuple(o.name for o in ops)

    coll = _tp_collectives("fwd", v, BYTES * T * h, 2) + _tp_collectives("bwd", v, BYTES * T * h, 2)
    if v.sp and v.tp > 1:
        # Megatron keeps only the sequence shard of the QKV and FC1 inputs and re-gathers it in
        # backward for their weight gradients (Korthikanti et al. 2022, section 4.2.2)
        coll.append(Collective("all_gather", "bwd", "tp", BYTES * T * h, 2))
    if m.is_moe and v.ep > 1:
        # Megatron-Core MoEAlltoAllTokenDispatcher (megatron/core/transformer/moe/
        # token_dispatcher.py): with sp each rank routes its own sequence shard, token_dispatch /
        # token_combine all-to-all those T k / t token copies over ep, dispatch_postprocess
        # all-gathers the received ones over the expert-tensor-parallel group (size t by default,
        # ModelParallelConfig.__post_init__) and combine_preprocess reduce-scatters them back
        etp = t if v.sp else 1
        routed = BYTES * T * m.top_k * h  # every routed token copy of the micro-batch
        coll += [Collective("all_to_all", "fwd", "ep", routed / etp, 2),
                 Collective("all_to_all", "bwd", "ep", routed / etp, 2)]
        if etp > 1:
            coll += [Collective("all_gather", "fwd", "tp", routed, 1),
                     Collective("reduce_scatter", "fwd", "tp", routed, 1),
                     Collective("reduce_scatter", "bwd", "tp", routed, 1),
                     Collective("all_gather", "bwd", "tp", routed, 1)]
    if c > 1:
        kv = BYTES * 2 * b * s * hkv / t  # the gathered K and V of the whole sequence
        coll += [Collective("all_gather", "fwd", "cp", kv, 1),
                 Collective("all_gather", "bwd", "cp", kv, 1),
                 Collective("reduce_scatter", "bwd", "cp", kv, 1)]
    return LayerCost(
        ops=tuple(ops),
        collectives=tuple(coll),
        dense_params=dense_params,
        expert_params=expert_params,
        act_bytes={"none": act_none, "selective": act_sel, "full": act_full},
        recompute_ops={"none": (), "selective": ("attention",), "full": names},
        output_bytes=BYTES * T * h / t,  # Megatron scatter/gather: each tp rank sends 1/t
    )


def embedding_cost(m: ModelSpec, b: int, v: Variant) -> LayerCost:
    t = v.tp
    h = m.hidden_size
    T = b * m.seq_len / v.cp
    T_out = T / t if v.sp else T
    ops = [_memory("embedding_lookup", 2 * T * h, 2 * T * h)]
    if m.learned_positions or m.family == "bert":
        ops.append(_memory("embedding_add", 3 * T_out * h, 2 * T_out * h))
    if m.family == "bert":
        ops.append(_memory("embedding_norm", 2 * T_out * h, 3 * T_out * h))
    dense = m.vocab_size * h / t + (embedding_params(m) - m.vocab_size * h)
    drop = 1.0 if m.has_dropout else 0.0
    act = (drop * T * h + (2 * T * h if m.family == "bert" else 0)) / (t if v.sp else 1)
    coll = []
    if t > 1:  # vocab-parallel embedding: partial sums reduced (reduce-scatter with sp)
        coll.append(Collective("reduce_scatter" if v.sp else "all_reduce", "fwd", "tp",
                               BYTES * T * h, 1))
        if v.sp:  # its conjugate in backward: the sequence-sharded gradient is gathered
            coll.append(Collective("all_gather", "bwd", "tp", BYTES * T * h, 1))
    return LayerCost(tuple(ops), tuple(coll), dense, 0.0,
                     {"none": act, "selective": act, "full": act},
                     {"none": (), "selective": (), "full": ()}, BYTES * T * h / t)


def head_cost(m: ModelSpec, b: int, v: Variant) -> LayerCost:
    t = v.tp
    h, V = m.hidden_size, m.vocab_size
    T = b * m.seq_len / v.cp
    T_norm = T / t if v.sp else T
    ops = []
    if m.family == "bert":
        ops.append(_matmul("mlm_dense", T, h, h))
    ops.append(_memory("final_norm", 2 * T_norm * h, 3 * T_norm * h))
    ops.append(_matmul("lm_head", T, V / t, h))
    # vocab-parallel cross-entropy: read bf16 logits, write fp32 softmax (and back in backward)
    ops.append(_memory("cross_entropy", 3 * T * V / t, 3 * T * V / t))
    dense = head_params(m) + (V * h if m.tied_embeddings else 0)  # a tied head stores a copy
    dense -= V * h * (t - 1) / t  # vocab-parallel LM head
    if m.family == "bert":
        dense -= V * (t - 1) / t  # and its decoder bias
    # saved: final-norm input, LM-head input, fp32 softmax of the logits (Megatron's
    # vocab_parallel_cross_entropy keeps it for backward)
    act = 2 * T_norm * h + 2 * T * h + 4 * T * V / t
    if m.family == "bert":
        act += 4 * T * h  # the MLM transform's dense input and GELU input (2 B each)
    coll = []
    if t > 1:
        if v.sp:
            coll.append(Collective("all_gather", "fwd", "tp", BYTES * T * h, 1))
            coll.append(Collective("reduce_scatter", "bwd", "tp", BYTES * T * h, 1))
        else:
            coll.append(Collective("all_reduce", "bwd", "tp", BYTES * T * h, 1))
        coll.append(Collective("all_reduce", "fwd", "tp", 4 * T, 3))  # max, sum, target logit
    return LayerCost(tuple(ops), tuple(coll), dense, 0.0,
                     {"none": act, "selective": act, "full": act},
                     {"none": (), "selective": (), "full": ()}, 0.0)


def build_layer_graph(m: ModelSpec, mbs: int = 1, variants: list[Variant] | None = None) -> LayerGraph:
    check_supported(m)
    variants = variants or variants_of(m)
    layers = [Layer(0, "embedding", "embedding", embedding_params(m),
                    {v.key: embedding_cost(m, mbs, v) for v in variants})]
    blk = {v.key: block_cost(m, mbs, v) for v in variants}  # identical blocks share one object
    for i in range(m.num_layers):
        layers.append(Layer(i + 1, f"block_{i}", "block", block_params(m), blk))
    layers.append(Layer(m.num_layers + 1, "head", "head", head_params(m),
                        {v.key: head_cost(m, mbs, v) for v in variants}))
    return LayerGraph(m.name, mbs, m.seq_len, m.hidden_size, m.tied_embeddings, variants, layers)
