"""Layer graph x FP8 compute -> the activations Transformer Engine saves for backward.

Under FP8 (nest.spec.precision), Transformer Engine's linear layers cast their input to FP8 for the
forward GEMM and keep that FP8 copy (1 byte per element) for the weight-gradient GEMM instead of
the BF16 input (2 bytes; transformer_engine/pytorch/module/linear.py and layernorm_linear.py
save the quantised input). So for every FP8 GEMM (nest.spec.precision.FP8_GEMMS) of a layer the saved
bytes of its input halve:
    saving = m x k per instance   (the input X[m, k] of the op's first GEMM, `count` instances)
with two exceptions:
* the column-parallel inputs (qkv, mlp_up / mlp_gate_up) of a sequence-parallel variant are kept
  as the sequence shard and gathered again in backward (Korthikanti et al. 2022, 4.2.2): their
  saved bytes, and so the saving, are 1 / tp of m x k;
* the out-projection's input is the attention output O, which a fused (flash) attention kernel
  also keeps in BF16 for its own backward: the FP8 copy is then kept beside it (+ m x k bytes)
  rather than instead of it. (With Megatron's unfused core O is not needed by attention's
  backward, and the FP8 copy replaces it.)
Modes "none" and "selective" keep the GEMM inputs and change; "full" keeps only the layer input.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from nest.graph.layer_graph import LayerCost, LayerGraph, Variant
from nest.spec.precision import FP8_GEMMS

SHARDED_WITH_SP = ("qkv", "mlp_up", "mlp_gate_up")  # inputs gathered over tp under sp


def with_fp8_activations(graph: LayerGraph) -> LayerGraph:
    """`graph` (viewed with its attention kernel) with FP8 saved GEMM inputs (cached)."""
    if graph.fp8_activations:
        return graph
    return _fp8_view(graph)


@lru_cache(maxsize=128)  # one view per graph (frozen, compared by identity)
def _fp8_view(graph: LayerGraph) -> LayerGraph:
    done: dict[int, LayerCost] = {}

    def view(key: str, c: LayerCost) -> LayerCost:
        if (key, id(c)) not in done:
            done[key, id(c)] = _fp8(c, Variant.from_key(key), graph.attention)
        return done[key, id(c)]

    layers = [replace(la, costs={k: view(k, c) for k, c in la.costs.items()})
              for la in graph.layers]
    return replace(graph, layers=layers, fp8_activations=True)


def saved_input_change(c: LayerCost, v: Variant, attention: str) -> float:
    """Bytes the FP8 GEMMs of one layer change in its saved activations (negative: saved)."""
    delta = 0.0
    for op in c.ops:
        if op.kind != "matmul" or op.name not in FP8_GEMMS or len(op.shape) != 3:
            continue
        m, _, k = op.shape
        elems = m * k * op.count
        if op.name in SHARDED_WITH_SP and v.sp:
            elems /= v.tp
        if op.name == "out_proj" and attention == "flash":
            delta += elems  # an FP8 copy beside the BF16 output attention keeps
        else:
            delta -= elems  # 2 bytes -> 1 byte
    return delta


def _fp8(c: LayerCost, v: Variant, attention: str) -> LayerCost:
    delta = saved_input_change(c, v, attention)
    if not delta:
        return c
    act = dict(c.act_bytes)
    for mode in ("none", "selective"):
        if mode in act:
            act[mode] = act[mode] + delta
    return replace(c, act_bytes=act)
