"""Layer graph x attention implementation -> the layer graph that implementation runs.

Both graph sources (torch.fx and the closed form) describe the attention core once: one
`attention` operator with the model FLOPs of the score and context products (a causal mask
counted as half the square), the traffic of a fused kernel (Q, K, V in, O out), and the saved
activations of Megatron-LM's unfused core (Korthikanti et al. 2022, section 4.1: softmax output,
dropout mask and dropout output, 5 a s^2 b bytes, in act_bytes["none"]; selective recomputation
re-runs the core and keeps only its input). `with_attention` turns that description into the
implementation a run uses, so that time, memory and recomputation describe the same kernels:

* "flash" (FlashAttention / cuDNN fused attention; Dao et al. 2022, 2023): one fused kernel, the
  scores never reach HBM. Saved for backward: Q, K, V (the core's input, kept by selective too),
  O (the out-projection's input, saved anyway) and the fp32 softmax log-sum-exp, 4 bytes per
  query and head. So act["none"] = act["selective"] + LSE. The flash backward recomputes the
  scores inside its own (measured) kernel; Megatron's selective recomputation of the core would
  save nothing more, so "selective" keeps the same bytes and re-runs nothing (it equals "none").
* "unfused" (Megatron-LM's CoreAttention of 2021-22, the A100 runs of Narayanan et al. 2021 and
  Korthikanti et al. 2022): `baddbmm` Q K^T over the whole s x s square (the causal mask is
  applied afterwards, so no FLOP is skipped), the fused scale-mask-softmax kernel (reads the
  scores, writes the probabilities, bf16), dropout on the probabilities (writes its output and a
  1-byte mask) and `bmm` with V. Four operators priced like any other (the batched GEMMs by
  their per-matrix shape, nest.costs.roofline), the saved bytes as the graph has them, and
  selective recomputation re-runs exactly these four.
Model FLOPs (for MFU) stay those of the description: an unfused causal run executes twice the
score FLOPs it is credited with.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from nest.graph.layer_graph import LayerCost, LayerGraph, Op, Variant

IMPLEMENTATIONS = ("flash", "unfused")
VIEWS = 128  # graphs viewed per process (build_graph keeps 64 graphs)
BF16 = 2
LSE_BYTES = 4  # fp32 log-sum-exp per query row and head (FlashAttention-2's softmax statistic)
DROPOUT_MASK_BYTES = 1  # Megatron's fused dropout keeps a byte mask


def resolve(setting: str, hardware) -> str:
    """The implementation a training setting names ("auto": the hardware file's default)."""
    impl = hardware.attention_implementation if setting == "auto" else setting
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation {impl!r}: expected one of "
                         f"{('auto', *IMPLEMENTATIONS)}")
    return impl


def with_attention(graph: LayerGraph, impl: str, dropout: bool) -> LayerGraph:
    """`graph` as `impl` runs it (module docstring); the graph itself is never changed."""
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation {impl!r}: expected one of {IMPLEMENTATIONS}")
    if graph.attention == impl:
        return graph
    if graph.attention != "described":
        raise ValueError(f"layer graph of {graph.model} is already viewed as {graph.attention}")
    return _view(graph, impl, dropout)


@lru_cache(maxsize=VIEWS)  # one view per graph (frozen, by identity) and kind
def _view(graph: LayerGraph, impl: str, dropout: bool) -> LayerGraph:
    done: dict[int, LayerCost] = {}  # identical blocks share one cost object: keep that

    def view(c: LayerCost) -> LayerCost:
        if id(c) not in done:
            done[id(c)] = _flash(c) if impl == "flash" else _unfused(c, dropout)
        return done[id(c)]

    layers = [replace(la, costs={k: view(c) for k, c in la.costs.items()}) for la in graph.layers]
    flops = None
    if Variant().key in graph.layers[0].costs:  # model FLOPs are the unsplit variant's
        flops = {full: graph.model_flops_per_sample(full) for full in (False, True)}
    return replace(graph, layers=layers, attention=impl, model_flops=flops)


def _attention_op(c: LayerCost) -> Op | None:
    ops = [o for o in c.ops if o.kind == "attention"]
    assert len(ops) <= 1, "one attention core per layer"
    return ops[0] if ops else None


def _flash(c: LayerCost) -> LayerCost:
    op = _attention_op(c)
    if op is None:
        return c
    b, heads, s_q, _, _ = op.shape
    lse = LSE_BYTES * b * heads * s_q * op.count
    kept = c.act_bytes["selective"] + lse
    act = {**c.act_bytes, "none": kept, "selective": kept}
    rec = {**c.recompute_ops, "selective": ()}
    return replace(c, act_bytes=act, recompute_ops=rec)


def unfused_ops(op: Op, dropout: bool) -> tuple[Op, ...]:
    """The kernels of Megatron's unfused core for one `attention` op (shape b, heads, s_q, s_kv,
    head_dim; bf16). The two products are batched GEMMs, one kernel each over b x heads matrices:
    shape (m, n, k, batch) (nest.costs.roofline.matmul_times)."""
    b, heads, s_q, s_kv, d = op.shape
    n_mat = b * heads * op.count
    sq = float(s_q * s_kv) * n_mat  # score elements
    gemm = 2.0 * s_q * s_kv * d * n_mat  # one product over the whole square
    # Q K^T: read Q, K, write S; backward dQ = dS K and dK = dS^T Q read and write as much again
    qk_io = BF16 * n_mat * (s_q * d + s_kv * d) + BF16 * sq
    pv_io = BF16 * sq + BF16 * n_mat * (s_kv * d + s_q * d)  # P V: read P, V, write O
    return tuple(o for o in (
        Op("attn_scores", "matmul", gemm, 2 * gemm, qk_io, 2 * qk_io, (s_q, s_kv, d, n_mat)),
        # scale-mask-softmax: read S, write P; backward reads P and dP, writes dS
        Op("attn_softmax", "memory", 0.0, 0.0, 2 * BF16 * sq, 3 * BF16 * sq),
        # dropout: write P' and the mask; backward reads dP' and the mask, writes dP
        Op("attn_dropout", "memory", 0.0, 0.0, (2 * BF16 + DROPOUT_MASK_BYTES) * sq,
           (2 * BF16 + DROPOUT_MASK_BYTES) * sq) if dropout else None,
        Op("attn_context", "matmul", gemm, 2 * gemm, pv_io, 2 * pv_io, (s_q, d, s_kv, n_mat)),
    ) if o is not None)


def _unfused(c: LayerCost, dropout: bool) -> LayerCost:
    op = _attention_op(c)
    if op is None:
        return c
    new = unfused_ops(op, dropout)
    ops = []
    for o in c.ops:
        ops.extend(new if o is op else (o,))
    names = tuple(o.name for o in new)

    def swap(modes: tuple[str, ...]) -> tuple[str, ...]:
        out = []
        for n in modes:
            out.extend(names if n == op.name else (n,))
        return tuple(out)

    return replace(c, ops=tuple(ops), recompute_ops={k: swap(v) for k, v in
                                                      c.recompute_ops.items()})
