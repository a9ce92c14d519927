"""Parameters x ZeRO stage x stash -> bytes per device: the one memory model (scalars or arrays).

Peak memory of a stage (Rajbhandari et al. 2020 for the ZeRO sharding; Narayanan et al. 2021a
for the 1F1B stash; Korthikanti et al. 2022 for activations and recomputation):
    weights            w * P / shards(z >= 3)         w bytes per parameter (BF16: 2)
    gradients          g * P / shards(z >= 2)         g: the gradient buffer's (reduce) dtype
    optimizer_states   o * P / shards(z >= 1)         master + moments; Adam FP32: 12
    fp8_weights        f * P8 (z < 3)                 FP8: Transformer Engine's cached FP8 weight
                                                      + transpose of the P8 FP8-GEMM parameters
    activations        stash * act                    micro-batches held at the peak
    working            max layer (act(none) - act(r)) + (z == 3: one layer's gathered weights
                                                        and their FP8 cache)
    step_transient     c * P / shards(z >= 1)         c: the optimizer's fp32 copy of its
                                                      gradient shard when the buffer is BF16
                                                      (else 0); lives from the optimizer step to
                                                      the next step's zero_grad only
    allocated          states + max(activations + working, step_transient)       (`allocated`)
                       where states = weights + gradients + optimizer_states + fp8_weights
    peak               allocated * (1 + fragmentation) + framework reserve    (hardware file)
The copy is made by the optimizer step (Megatron-Core DistributedOptimizer.
_copy_model_grads_to_main_grads: shard_main_param.grad = shard_model_grad.float(); at z = 0
Float16OptimizerWithFloat16Params._copy_model_grads_to_main_grads: main_param.grad =
model_param.main_grad.float(), unsharded) and freed by optimizer.zero_grad(set_to_none=True),
which train_step (megatron/training/training.py; Megatron-Bridge's training/train.py alike) calls
with the grad buffers' zero_grad_buffer() before the first forward of the next step: it never
coexists with stashed activations or the working set, which are all freed by then.
w, g, c, o, f follow the training's precision (nest.spec.precision); with the defaults (BF16 weights,
FP32 gradients and Adam states) weights + gradients + optimizer_states are Megatron-LM's
18 B per parameter, 6 + 12 / d with the distributed optimizer (z = 1;
megatron/training/theoretical_memory_usage.py, num_bytes_per_parameter).
P splits into dense and expert parameters: dense weights are replicated over the dp, ep and cp
ranks of a stage, experts over the dp and cp ranks (`shard_sizes`). Every function broadcasts over
NumPy arrays, so the solver's [b, a, z, r] tables and the evaluator's one stage are the same
formula.
"""

from __future__ import annotations

import numpy as np

MEMORY_KEYS = ("weights", "gradients", "optimizer_states", "activations", "working")
STEP_KEY = "step_transient"  # the optimizer step's fp32 gradient copy (`state_bytes`)
REUSE_KEY = "step_reuse"  # <= 0: the part of it that fits in the freed activations (`with_overheads`)


def shard_sizes(dp: int, ep: int, cp: int) -> tuple[int, int]:
    """Ranks holding a copy of a dense / an expert parameter: dense weights are replicated over
    the dp, ep and cp ranks, experts over the dp and cp ranks (each ep rank holds other experts)."""
    return dp * ep * cp, dp * cp


def per_device(p_dense, p_expert, dp: int, ep: int, cp: int, sharded):
    """Parameters one device keeps of a state that ZeRO shards over its replicas (or not);
    `sharded` may be a bool or a boolean array (broadcast)."""
    n_dense, n_exp = shard_sizes(dp, ep, cp)
    if isinstance(sharded, (bool, np.bool_)):
        return p_dense / n_dense + p_expert / n_exp if sharded else p_dense + p_expert
    return np.where(sharded, p_dense / n_dense + p_expert / n_exp, p_dense + p_expert)


def state_bytes(p_dense, p_expert, dp: int, ep: int, cp: int, z: int, training,
                p_fp8=0.0) -> dict:
    """Weights, gradients and optimizer states per device under ZeRO stage z; p_fp8: the
    stage's parameters in FP8 GEMMs per device (nest.costs.layers, LayerTable.fp8_LL), whose
    FP8 weight cache counts under FP8 compute (the key is present only then). STEP_KEY (present
    only when the optimizer copies BF16 gradients to FP32): the copy, which exists during the
    optimizer step only, so it is not resident (`resident_and_step`, `allocated`)."""
    def sh(on: bool):
        return per_device(p_dense, p_expert, dp, ep, cp, on)

    pr = training.precision
    out = {"weights": training.weight_bytes_per_param * sh(z >= 3),
           "gradients": training.grad_bytes_per_param * sh(z >= 2),
           "optimizer_states": training.optimizer_state_bytes * sh(z >= 1)}
    if pr.main_grad_copy_bytes:
        out[STEP_KEY] = pr.main_grad_copy_bytes * sh(z >= 1)
    if pr.fp8:  # z = 3: cached per gathered layer only (`working_bytes`)
        out["fp8_weights"] = pr.fp8_cache_bytes() * p_fp8 * (z < 3)
    return out


def resident_and_step(states: dict):
    """(resident, step) bytes of a `state_bytes` record: what stays allocated through the whole
    step, and what the optimizer step holds (resident + its transient copy)."""
    resident = sum(x for k, x in states.items() if k != STEP_KEY)
    return resident, resident + states.get(STEP_KEY, 0.0)


def allocated(held, step):
    """The allocated bytes at a stage's peak, the one rule: the larger of what forward and
    backward hold (held = resident states + activations + working set) and what the optimizer
    step holds (step = resident states + its transient copy; `resident_and_step`): the copy is
    made after the last backward freed the activations and freed before the next forward
    (module docstring). Scalars or broadcasting arrays; without a copy, step <= held and this
    is held itself."""
    return np.maximum(held, step)


def working_bytes(work, max_layer_params, z: int, training):
    """The recomputation working set of one layer, plus one layer's gathered weights and their
    FP8 cache (ZeRO-3)."""
    return work + gathered_bytes(max_layer_params, z, training.weight_bytes_per_param
                                 + training.precision.fp8_cache_bytes())


def gathered_bytes(max_layer_params, z: int, weight_bytes_per_param: float):
    """ZeRO-3 all-gathers one layer's weights at a time (Rajbhandari et al. 2020, section 5.3)."""
    return weight_bytes_per_param * max_layer_params if z == 3 else 0.0


GRAD_BUFFERS = ("persistent", "lazy")


def lazy_gradient_peak(ops, act_C, grad_C) -> tuple[float, float]:
    """(activations, gradients) a device holds at the peak of their sum when each chunk's
    unsharded gradient buffer is created by the chunk's first backward (training setting
    grad_buffer: lazy). ops: the device's operation order, ('F' | 'B', chunk, micro-batch)
    (nest.costs.pipeline.interleaved_order); act_C[c]: what one micro-batch stashes in chunk c;
    grad_C[c]: chunk c's gradient buffer. A forward adds act_C[c]; a backward first creates the
    chunk's buffer if it has none (counted while the micro-batch's activations are still held),
    then frees the activations; the buffer stays to the end of the step (its reduce-scatter
    after the last micro-batch, and the shard it leaves, are not credited: an upper bound).
    Source: Meta's FSDP for Llama 3 (facebookresearch/fairscale, branch
    ngoyal_changes_for_pp_fp8, commit 3b7cc249, December 2023, FullyShardedDataParallel.
    _post_backward_hook: `param.unsharded_main_grad = param.grad.to(torch.float32)` when the
    parameter has none, `.add_` after; reduce-scattered in FP32 only when
    _require_backward_grad_sync, the last micro-batch, then set to None). Megatron-LM's buffer
    is persistent: the peak is max(activations) + every chunk's buffer. One chunk per device
    (non-interleaved 1F1B) peaks the same either way: its first backward comes at its
    activation peak."""
    held = grads = 0.0
    best = (-1.0, 0.0, 0.0)
    seen: set = set()
    for kind, c, _ in ops:
        if kind == "F":
            held += act_C[c]
        elif c not in seen:
            seen.add(c)
            grads += grad_C[c]
        if held + grads > best[0]:
            best = (held + grads, held, grads)
        if kind == "B":
            held -= act_C[c]
    return best[1], best[2]


def peak(allocated, hw):
    """Peak bytes of an allocation: allocator fragmentation plus the framework's fixed reserve
    (CUDA context, NCCL and cuBLAS buffers; hardware file framework_reserve_GB)."""
    return allocated + allocated * hw.memory_fragmentation + hw.memory_overhead_bytes


def with_overheads(parts: dict, hw) -> dict:
    """The allocated parts of `peak` plus its two overhead terms, named: their sum is the peak.
    With a STEP_KEY part, REUSE_KEY (<= 0) takes back what of it fits in the activations and
    working set freed before the optimizer step (`allocated`; an input REUSE_KEY is ignored and
    recomputed, so a device's summed chunk records may be passed back in)."""
    parts = {k: x for k, x in parts.items() if k != REUSE_KEY}
    if STEP_KEY in parts:
        resident, step = resident_and_step(
            {k: x for k, x in parts.items() if k not in ("activations", "working")})
        held = resident + parts.get("activations", 0.0) + parts.get("working", 0.0)
        parts[REUSE_KEY] = allocated(held, step) - held - parts[STEP_KEY]
    total = sum(parts.values())
    return {**parts, "fragmentation": total * hw.memory_fragmentation,
            "framework_overhead": hw.memory_overhead_bytes}


def allocatable(hw) -> float:
    """The largest allocation whose peak fits in HBM (the inverse of `peak`)."""
    return (hw.hbm_bytes - hw.memory_overhead_bytes) / (1 + hw.memory_fragmentation)


def optimizer_step_s(params_per_device, training, hw):
    """The optimizer step: HBM-bound, optimizer_step_bytes moved per parameter it updates
    (compute time: x the training settings' cost_scale.compute)."""
    return (training.optimizer_step_bytes * params_per_device
            / (hw.hbm_bytes_per_s * hw.memory_efficiency)) * training.cost_scale.compute


def optimizer_step_for(p_dense, p_expert, dp: int, ep: int, cp: int, z: int, training, hw):
    """The optimizer step of a stage: ZeRO (z >= 1) shards the update over the replicas."""
    return optimizer_step_s(per_device(p_dense, p_expert, dp, ep, cp, z >= 1), training, hw)


def tied_embedding_params(model, graph, tp: int) -> float:
    """The word embedding a tied LM head shares (Megatron-LM, Shoeybi et al. 2019), per device of
    a tp group: V * h / tp; 0 for untied models. The head's layer counts a copy of it, so
    (a) a stage holding both the embedding and the head keeps one copy (subtract it), and
    (b) with p > 1 the first and the last stage all-reduce its gradient (the embedding group)."""
    return model.vocab_size * model.hidden_size / tp if graph.tied_embeddings else 0.0
