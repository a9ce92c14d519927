"""Layer graph x hardware -> per-layer compute times: the cost table.

Each operator of a layer is priced by nest.costs.profiled.price_op: from a measured profile (by
default the one the hardware file names) where it covers the shape, else by the analytical
roofline (nest.costs.roofline.op_times). A layer's forward, backward and recompute times are
sums over its operators.

Main-gradient accumulation (`main_grad_accumulation_s`, part of the backward): every weight
gradient is added into the FP32 main-gradient buffer the memory model holds (nest.costs.memory:
Megatron-LM's param.main_grad). Megatron-LM runs it inside the wgrad GEMM
(--gradient-accumulation-fusion, on by default: fused_weight_gradient_mlp_cuda's
wgrad_gemm_accum_fp32, a cuBLAS GEMM with beta = 1 into the FP32 buffer;
megatron/core/tensor_parallel/layers.py, LinearWithGradAccumulationAndAsyncCommunication;
Transformer Engine's fuse_wgrad_accumulation does the same), so the GEMM's epilogue reads and
writes 4 + 4 bytes per weight element where the measured / fitted GEMMs (BF16 output) write 2:
6 extra bytes per weight element per micro-batch, at the streaming share of HBM bandwidth
(memory_efficiency). Priced additive where the hardware file says `gemm_epilogue: serial`
(A100; the V100 file does not set it): a non-persistent GEMM runs its epilogue after each
tile's main loop, and all tiles of a wave reach it together (CUTLASS 2.x kernel structure).
Hidden where it says `overlapped` (Hopper and later: CUTLASS 3's warp-specialized persistent
ping-pong kernels run one tile's epilogue under another tile's main loop; CUTLASS docs,
"efficient_gemm", Hopper warp-specialized kernels). A separate cast / copy kernel would be
additive anywhere (`main_grad_traffic_s`): the measured H100 blocks copy the BF16 gradients
into FP32 in their optimizer step (nest.fidelity.block_validation prices it so). PyTorch FSDP with an FP32 reduce
dtype casts in a separate kernel too (read 2 + write 4); the cost table does not know a run's
framework, so that cast is not priced (the MosaicML rows). Weight elements: every
non-batched matmul's k x n (the attention core's batched GEMMs have no weights).

MoE local-expert sort (`moe_local_sort_op`): the layer graph holds the sender side of token
routing (moe_permute into expert order, the expert-parallel all-to-alls, moe_combine back to token
order). Megatron-Core's alltoall token dispatcher (the one the launch template selects,
--moe-token-dispatcher-type alltoall) adds, when a rank holds more than one expert, a second
permutation on the receiving side: the received tokens arrive grouped by source rank and are
re-sorted by local expert before the expert GEMMs ("Permutation 2: Sort tokens by local
expert", MoEAlltoAllTokenDispatcher.dispatch_postprocess, sort_chunks_by_idxs) and un-sorted
before the combine all-to-all ("Unpermutation 2", combine_preprocess); megatron-core 0.16,
megatron/core/transformer/moe/token_dispatcher.py. Each is a memory-bound gather that reads and
writes every received token (under balanced routing as many bytes as the all-to-all's buffer),
and backward runs the two adjoint scatters over the gradients: one op of two kernels per phase,
each moving 2 x the all-to-all bytes, priced like the graph's moe_permute (price_op). Under
HybridEP (TrainingSettings.moe_dispatcher "hybridep") the sender-side moe_permute and
moe_combine run inside the dispatch / combine kernels and are not priced (FUSED_INTO_DISPATCH);
the receiving side's sort stays (Hybrid-EP's permute kernel, "independent mode" by default).

MoE terms the graph does not hold (nest.costs.moe_time): the dropless dispatcher's device-to-host
wait in the forward (`launch_queue_s`, `wait_idle_s`), the busiest expert-parallel rank's expert compute
(`busiest_rank_ops`), the experts' output-bias loop (`moe_expert_bias_op`) and their GLU input
clamp (`moe_expert_clamp_op`).

Imports: roofline <- profiled <- table; profiled <- moe_time, rope <- table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from nest.costs.moe_time import (EXPERT_BIAS, EXPERT_CLAMP, MOE_SORT, busiest_rank_ops,
                                 dispatch_sync_queued, moe_expert_bias_op, moe_expert_clamp_op,
                                 synced_segment, wait_idle_s)
from nest.costs.profiled import BYTES, ProfileSet, price_op, profile_for
from nest.costs.rope import ROPE_UNFUSED, rope_unfused_op
from nest.graph.layer_graph import (COLUMN_PARALLEL, RECOMPUTE_MODES, ROW_PARALLEL, LayerCost,
                                    LayerGraph, Op, Variant)
from nest.spec.catalog import HardwareSpec, validate

SCHEMA = "nest.cost_table/v1"
AUTO = "auto"  # CostTable(profile=AUTO): the profile the hardware file names, if any


@dataclass(frozen=True)
class LayerTimes:
    fwd_s: float
    bwd_s: float
    recompute_s: Mapping[str, float]  # mode -> forward time re-run during backward
    source: str = "roofline"  # "profile" when any operator came from a measured profile
    # op name -> "profile" | "roofline" | "mixed" (forward and backward from different sources)
    op_sources: Mapping[str, str] = field(default_factory=dict)
    # the GEMMs' share of fwd_s / bwd_s: what tensor-parallel communication can overlap
    # (TrainingSettings.tp_comm_overlap, nest.costs.groups)
    gemm_fwd_s: float = 0.0
    gemm_bwd_s: float = 0.0
    # the forward of the row-parallel GEMMs whose output is reduce-scattered over tp (attention
    # out-projection, MLP down projection): Transformer Engine's pipelined overlap runs them
    # beside its reduce-scatter kernels (nest.costs.groups.tp_overlapped)
    proj_fwd_s: float = 0.0
    down_fwd_s: float = 0.0
    # the backward (dgrad + wgrad) of the column-parallel GEMMs whose input is gathered over tp
    # (QKV, MLP up / gate-up): TE's `bulk` overlap runs its collectives beside them
    col_bwd_s: float = 0.0


def layer_times(hw: HardwareSpec, cost: LayerCost,
                profile: ProfileSet | None = None, compute: str = "bf16",
                dispatcher: str = "alltoall", moe_imbalance: float = 1.0,
                moe_padded: bool = False, expert_bias: bool = False,
                fp8_recipe: str = "delayed", variant: Variant | None = None,
                expert_clamp: bool = False, rope_unfused: bool = False,
                recompute_modules: tuple[str, ...] = ()) -> LayerTimes:
    """Forward, backward and recompute seconds of one layer; from `profile` where it covers,
    else (or with profile None) the roofline; compute: the training's compute dtype
    (nest.spec.precision: "fp8" runs the linear layers' GEMMs in FP8); dispatcher: the MoE
    token dispatcher (TrainingSettings.moe_dispatcher; `FUSED_INTO_DISPATCH`); moe_imbalance:
    the busiest expert-parallel rank's tokens over the mean (`busiest_rank_ops`); moe_padded:
    expert inputs padded to capacity (no device-to-host sync; `dispatch_sync_queued`);
    expert_bias: the experts have biases (`moe_expert_bias_op`); fp8_recipe and variant (None:
    tp 1): Transformer Engine's FP8 quantization kernels (nest.costs.fp8_quant); expert_clamp:
    the experts clamp their GLU input (`moe_expert_clamp_op`); rope_unfused: rotary embeddings
    in eager PyTorch (nest.costs.rope.rope_unfused_op); recompute_modules: Megatron-Core's
    selective module recomputation (`module_recompute_ops`), its forward added to the backward."""
    v = variant or Variant()
    fused = FUSED_INTO_DISPATCH.get(dispatcher, ())
    ops = (*(op for op in cost.ops if op.name not in fused), *moe_local_sort_op(cost),
           *moe_expert_clamp_op(cost, expert_clamp), *moe_expert_bias_op(cost, expert_bias),
           *rope_unfused_op(cost, rope_unfused))
    priced = {op.name: price_op(hw, op, profile, compute, fp8_recipe, v.tp, v.sp) for op in ops}
    busiest = busiest_rank_ops(cost, ops) if moe_imbalance != 1.0 else ()
    priced = {name: replace(t, fwd_s=t.fwd_s * moe_imbalance, bwd_s=t.bwd_s * moe_imbalance)
              if name in busiest else t for name, t in priced.items()}
    per_op = {name: (t.fwd_s, t.bwd_s) for name, t in priced.items()}
    srcs = {name: t.fwd_source if t.fwd_source == t.bwd_source else "mixed"
            for name, t in priced.items()}
    calls = {op.name: op.count for op in ops}  # operator calls the host issues
    # host floor: the GPU cannot run a layer faster than the host issues its operators (per
    # layer; nest.profiling.host measures the per-operator time); a dropless MoE layer's
    # forward waits once for the device (nest.costs.moe_time.wait_idle_s)
    queued = None if moe_padded else dispatch_sync_queued(ops, dispatcher)
    idle = (0.0 if queued is None else
            wait_idle_s(synced_segment(ops, per_op), hw.host_fwd_s_per_op, queued))
    fwd = max(sum(f for f, _ in per_op.values()) + idle,
              hw.host_fwd_s_per_op * sum(calls.values()))
    bwd = max(sum(b for _, b in per_op.values()), hw.host_bwd_s_per_op * sum(calls.values()))
    def rerun_s(names) -> float:  # a recomputed forward: GPU time, or the host's issue time
        return max(sum(per_op[name][0] for name in names),
                   hw.host_fwd_s_per_op * sum(calls[name] for name in names))

    rec = {mode: rerun_s(_recomputed(cost, mode, per_op)) for mode in RECOMPUTE_MODES}
    bwd += main_grad_accumulation_s(hw, cost)
    bwd += rerun_s(module_recompute_ops(recompute_modules, per_op)) if recompute_modules else 0.0
    source = "roofline" if all(s == "roofline" for s in srcs.values()) else "profile"
    gemm = [per_op[op.name] for op in ops if op.kind == "matmul"]
    return LayerTimes(fwd, bwd, MappingProxyType(rec), source, MappingProxyType(srcs),
                      sum(f for f, _ in gemm),
                      sum(b for _, b in gemm),
                      per_op.get(ROW_PARALLEL[0], (0.0, 0.0))[0],
                      per_op.get(ROW_PARALLEL[1], (0.0, 0.0))[0],
                      sum(per_op[name][1] for name in COLUMN_PARALLEL if name in per_op))



# the sender-side MoE ops a dispatcher runs inside its communication kernels: HybridEP's
# dispatch kernel reads each token once and writes its copies straight to the experts' ranks
# (no gather into expert order first), and its combine kernel reduces a token's k weighted
# expert outputs as it receives them ("Reduce Warp Group"); the receiving side's permute /
# unpermute kernels remain (the local sort). DeepEP branch hybrid-ep, the Hybrid-EP
# implementation guide ("Executor", "Hybrid-EP Kernels"); Megatron-Core's HybridEPDispatch,
# "Fused dispatch operation for permute + dispatch a2a + permute" (fused_a2a.py).
FUSED_INTO_DISPATCH = {"hybridep": ("moe_permute", "moe_combine")}


def moe_local_sort_op(cost: LayerCost) -> tuple[Op, ...]:
    """The receiving side's sort of tokens by local expert and its un-sort (module docstring):
    () unless the layer has an expert-parallel all-to-all and more than one local expert; else
    one memory-bound op, `count` = 2 kernels per phase (sort + un-sort), each reading and writing
    the received buffer (forward: the dispatched tokens, tp-gathered with tp > 1; backward:
    their gradients)."""
    experts = [op for op in cost.ops if op.kind == "matmul" and op.name.startswith("expert_")]
    local = max((op.count for op in experts), default=0)
    a2a = {ph: [c for c in cost.collectives if c.kind == "all_to_all" and c.group == "ep"
                and c.phase == ph] for ph in ("fwd", "bwd")}
    if local <= 1 or not a2a["fwd"]:
        return ()
    n = sum(c.count for c in a2a["fwd"])  # dispatch + combine: one sort each
    # with tp > 1 the sort runs after dispatch_postprocess's expert-tensor-parallel all-gather,
    # on etp x the all-to-all's tokens: etp = the experts' input rows over the all-to-all's
    gate_up = experts[0]
    sent = sum(c.bytes * c.count for c in a2a["fwd"]) / n
    etp = max(1, round(BYTES * gate_up.shape[0] * gate_up.shape[2] * gate_up.count / sent))
    per = {ph: 2.0 * sum(c.bytes * c.count for c in cs) / n * etp for ph, cs in a2a.items()}
    return (Op(MOE_SORT, "memory", 0.0, 0.0, per["fwd"], per["bwd"], (), n),)


def _recomputed(cost: LayerCost, mode: str, per_op: Mapping) -> tuple[str, ...]:
    """Op names a recompute mode re-runs (those priced: a dispatcher's fused ops are not); the
    local-expert sort with the graph's moe_permute, the expert bias with expert_down, the GLU
    clamp with the experts' activation, eager RoPE with `rope` (or when the mode re-runs every
    op)."""
    names = tuple(cost.recompute_ops.get(mode, ()))
    every = bool(names) and set(names) >= {op.name for op in cost.ops}
    sort = MOE_SORT in per_op and ("moe_permute" in names or every)
    bias = EXPERT_BIAS in per_op and ("expert_down" in names or every)
    clamp = EXPERT_CLAMP in per_op and (bool(set(names) & GLU_ACTS) or every)
    rope = ROPE_UNFUSED in per_op and ("rope" in names or every)
    return (tuple(n for n in names if n in per_op) + ((MOE_SORT,) if sort else ())
            + ((EXPERT_BIAS,) if bias else ()) + ((EXPERT_CLAMP,) if clamp else ())
            + ((ROPE_UNFUSED,) if rope else ()))


GLU_ACTS = {"expert_swiglu", "expert_geglu"}  # the experts' activation op (torch_models.MoE)

DENSE_ACTS = ("gelu", "geglu", "swiglu")  # the dense MLP's activation op (torch_models.Mlp)

# Selective module recomputation -> the graph's operators whose forward re-runs in the backward.
# Megatron-Core's --recompute-modules: "layernorm" checkpoints the block's input_layernorm and
# pre_mlp_layernorm (TransformerLayer, CheckpointWithoutOutput, recomputed before the consumer's
# backward); "moe_act" the experts' bias_act_func (TEGroupedMLP.activation_checkpoint: the GLU
# clamp where the model has one and the weighted activation). megatron-core 0.16 (9ed8b0c) and
# 0.18.0rc (4415119), transformer_layer.py and moe/experts.py. "act" is not a Megatron-Core
# module (0.16.1 and main @ d98e8a6 offer "mlp", the whole MLP, and no dense activation alone):
# it is Meta's metaseq SequeuceParallelTransformerBlock
# (metaseq/modules/sequence_parallel_transformer_layer.py @ 33588d8, "gelu, layernorm: always
# recomputed i.e. no activation memory for these"), whose backward re-runs the activation from
# the kept fc1 output before the down projection's weight gradient; with "layernorm" it is that
# block's saved set. Modules a layer lacks add nothing.
MODULE_RECOMPUTE = {"layernorm": ("norm1", "norm2"),
                    "moe_act": (EXPERT_CLAMP, *sorted(GLU_ACTS)),
                    "act": DENSE_ACTS}
FREED_MODES = ("none", "selective")  # "full" keeps only the layer input: nothing left to free


def module_freed_bytes(modules, cost: LayerCost, variant: Variant, fp8: bool) -> float:
    """Bytes per micro-batch a layer no longer keeps for backward when `modules` are recomputed
    (MODULE_RECOMPUTE), in recompute modes FREED_MODES. "layernorm": each norm's output, the
    saved input of the GEMM after it, the hidden state X[m, k] of the qkv GEMM (the sequence
    shard under sequence parallelism, as the graph keeps it); "act": the activation's output,
    the down projection's saved input X[m, k]. BF16 (2 B). Under FP8 (fp8: the graph keeps
    Transformer Engine's FP8 copies of the GEMM inputs, nest.graph.fp8) the copy stays and
    nothing is freed; "moe_act"'s memory is not credited (conservative)."""
    if fp8:
        return 0.0
    names = {op.name for op in cost.ops}
    gemm = {op.name: op for op in cost.ops if op.kind == "matmul" and len(op.shape) == 3}
    freed = 0.0
    if "layernorm" in modules and "qkv" in gemm:
        m, _, k = gemm["qkv"].shape
        norms = sum(n in names for n in MODULE_RECOMPUTE["layernorm"])
        freed += norms * BYTES * m * k / (variant.tp if variant.sp else 1)
    if "act" in modules and "mlp_down" in gemm and names & set(DENSE_ACTS):
        m, _, k = gemm["mlp_down"].shape
        freed += BYTES * m * k * gemm["mlp_down"].count
    return freed


def module_recompute_ops(modules, per_op: Mapping) -> tuple[str, ...]:
    """The priced operators the modules re-run (MODULE_RECOMPUTE; those a layer has)."""
    return tuple(name for m in modules for name in MODULE_RECOMPUTE[m] if name in per_op)


MAIN_GRAD_EXTRA_BYTES = 6  # FP32 read + write of main_grad, less the BF16 write a GEMM prices


def weight_elements(cost: LayerCost) -> float:
    """Weight elements of a layer's matmuls per device (k x n of every non-batched GEMM)."""
    return float(sum(op.shape[1] * op.shape[2] * op.count for op in cost.ops
                     if op.kind == "matmul" and len(op.shape) == 3))


def main_grad_traffic_s(hw: HardwareSpec, cost: LayerCost) -> float:
    """MAIN_GRAD_EXTRA_BYTES per weight element of a layer at the streaming bandwidth: the
    FP32 main-gradient traffic of one micro-batch (fused into the wgrad GEMM, or as a separate
    cast / add kernel)."""
    return (MAIN_GRAD_EXTRA_BYTES * weight_elements(cost)
            / (hw.hbm_bytes_per_s * hw.memory_efficiency))


def main_grad_accumulation_s(hw: HardwareSpec, cost: LayerCost) -> float:
    """What the fused accumulation into the FP32 main gradients adds to a layer's backward
    (module docstring): its traffic where the hardware's GEMM epilogue is serial (A100: the
    epilogue follows each tile's main loop), 0 where it overlaps (Hopper's warp-specialized
    persistent kernels run one tile's epilogue under another's main loop; every wgrad of the
    published rows is compute-bound, so the traffic hides under the roofline's max)."""
    return main_grad_traffic_s(hw, cost) if hw.gemm_epilogue == "serial" else 0.0


class CostTable:
    """Per-layer times of one graph on one hardware: a pure function of its six fields, with no
    state of its own (a Problem keeps the priced layers in its nest.costs.cache.ProblemCache).

    profile: AUTO (default) uses the measured profile the hardware file names (`profile:` key;
    H100 SXM has one), None forces the roofline, or an explicit nest.costs.profiled.ProfileSet.
    compute: the training's compute dtype (nest.spec.precision.Precision.compute).
    scale: every time multiplied by it (the training settings' cost_scale.compute, applied by
    nest.problem.problem.Problem.build; the one point where compute time enters every planner's costs).
    dispatcher: the MoE token dispatcher (TrainingSettings.moe_dispatcher; FUSED_INTO_DISPATCH).
    moe_imbalance: the busiest expert-parallel rank's tokens over the mean
    (TrainingSettings.moe_routing_imbalance; `busiest_rank_ops`); moe_padded: expert inputs
    padded to capacity (TrainingSettings.moe_pad_to_capacity; `dispatch_sync_queued`);
    expert_bias: the model's experts have biases (ModelSpec.linear_bias; `moe_expert_bias_op`);
    fp8_recipe: the FP8 scaling recipe (Precision.fp8_recipe; nest.costs.fp8_quant);
    expert_clamp: the experts clamp their GLU input (ModelSpec.glu_clamp; `moe_expert_clamp_op`);
    rope_unfused: rotary embeddings in eager PyTorch (TrainingSettings.rope_fusion false;
    nest.costs.rope); recompute_modules: Megatron-Core's selective module recomputation
    (TrainingSettings.recompute_modules; `module_recompute_ops`).
    """

    __slots__ = ("graph", "hw", "compute", "scale", "profile", "dispatcher", "moe_imbalance",
                 "moe_padded", "expert_bias", "fp8_recipe", "expert_clamp", "rope_unfused",
                 "recompute_modules")

    def __init__(self, graph: LayerGraph, hw: HardwareSpec,
                 profile: ProfileSet | None | str = AUTO, compute: str = "bf16",
                 scale: float = 1.0, dispatcher: str = "alltoall", moe_imbalance: float = 1.0,
                 moe_padded: bool = False, expert_bias: bool = False,
                 fp8_recipe: str = "delayed", expert_clamp: bool = False,
                 rope_unfused: bool = False, recompute_modules: tuple[str, ...] = ()):
        if isinstance(profile, str):
            if profile != AUTO:
                raise ValueError(f"CostTable: profile must be a ProfileSet, None or {AUTO!r}")
            profile = profile_for(hw)
        for name, value in (("graph", graph), ("hw", hw), ("compute", compute),
                            ("scale", scale), ("profile", profile), ("dispatcher", dispatcher),
                            ("moe_imbalance", moe_imbalance), ("moe_padded", moe_padded),
                            ("expert_bias", expert_bias), ("fp8_recipe", fp8_recipe),
                            ("expert_clamp", expert_clamp), ("rope_unfused", rope_unfused),
                            ("recompute_modules", tuple(recompute_modules))):
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise AttributeError(f"CostTable is immutable: cannot set {name!r}")

    def times_of(self, cost: LayerCost, variant: Variant | None = None) -> LayerTimes:
        """One layer's times (any LayerCost of this table's graph, of `variant`)."""
        t = layer_times(self.hw, cost, self.profile, self.compute, self.dispatcher,
                        self.moe_imbalance, self.moe_padded, self.expert_bias,
                        self.fp8_recipe, variant, self.expert_clamp, self.rope_unfused,
                        self.recompute_modules)
        if self.scale != 1.0:
            k = self.scale
            t = replace(t, fwd_s=t.fwd_s * k, bwd_s=t.bwd_s * k,
                        recompute_s=MappingProxyType({m: x * k for m, x in t.recompute_s.items()}),
                        gemm_fwd_s=t.gemm_fwd_s * k, gemm_bwd_s=t.gemm_bwd_s * k,
                        proj_fwd_s=t.proj_fwd_s * k, down_fwd_s=t.down_fwd_s * k,
                        col_bwd_s=t.col_bwd_s * k)
        return t

    def times(self, layer_index: int, variant_key: str) -> LayerTimes:
        return self.times_of(self.graph.layers[layer_index].costs[variant_key],
                             Variant.from_key(variant_key))

    def to_dict(self) -> dict:
        rows = []
        for la in self.graph.layers:
            for v in self.graph.variants:
                t = self.times(la.index, v.key)
                rows.append({"layer": la.index, "name": la.name, "variant": v.key,
                             "fwd_s": t.fwd_s, "bwd_s": t.bwd_s, "recompute_s": dict(t.recompute_s),
                             "source": t.source, "op_sources": dict(t.op_sources)})
        return {"schema": SCHEMA, "model": self.graph.model, "mbs": self.graph.mbs,
                "hardware": self.hw.name, "rows": rows}

    def write(self, path: str | Path) -> None:
        d = self.to_dict()
        validate(d, "cost_table", str(path))
        from nest.common.atomic_io import write_text_atomic

        write_text_atomic(path, json.dumps(d, indent=1, sort_keys=True) + "\n")
