"""Parameters x ZeRO stage x stash -> bytes per device: the one memory model (scalars or arrays).

Peak memory of a stage (Rajbhandari et al. 2020 for the ZeRO sharding; Narayanan et al. 2021a
for the 1F1B stash; Korthikanti et al. 2022 for activations and recomputation):
    weights            w * P / shards(z >= 3)         w bytes per parameter (BF16: 2)
    gradients          g * P / shards(z >= 2)         g bytes per parameter (FP32: 4)
    optimizer_states   o * P / shards(z >= 1)         Adam: 12 (FP32 master copy + two moments)
    activations        stash * act                    micro-batches held at the peak
    working            max layer (act(none) - act(r)) + (z == 3: one layer's gathered weights)
    allocated          the sum of the above
    peak               allocated * (1 + fragmentation) + framework overhead   (hardware file)
P splits into dense and expert parameters: dense weights are replicated over the dp, ep and cp
ranks of a stage, experts over the dp and cp ranks (`shard_sizes`). Every function broadcasts over
NumPy arrays, so the solver's [b, a, z, r] tables and the evaluator's one stage are the same
formula.
"""

from __future__ import annotations

import numpy as np

MEMORY_KEYS = ("weights", "gradients", "optimizer_states", "activations", "working")


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


def state_bytes(p_dense, p_expert, dp: int, ep: int, cp: int, z: int, training) -> dict:
    """Weights, gradients and optimizer states per device under ZeRO stage z."""
    def sh(on: bool):
        return per_device(p_dense, p_expert, dp, ep, cp, on)

    return {"weights": training.weight_bytes_per_param * sh(z >= 3),
            "gradients": training.grad_bytes_per_param * sh(z >= 2),
            "optimizer_states": training.optimizer_state_bytes * sh(z >= 1)}


def working_bytes(work, max_layer_params, z: int, training):
    """The recomputation working set of one layer, plus one layer's gathered weights (ZeRO-3)."""
    return work + gathered_bytes(max_layer_params, z, training.weight_bytes_per_param)


def gathered_bytes(max_layer_params, z: int, weight_bytes_per_param: float):
    """ZeRO-3 all-gathers one layer's weights at a time (Rajbhandari et al. 2020, section 5.3)."""
    return weight_bytes_per_param * max_layer_params if z == 3 else 0.0


def peak(allocated, hw):
    """Peak bytes of an allocation: allocator fragmentation plus the framework's fixed overhead."""
    return allocated + allocated * hw.memory_fragmentation + hw.memory_overhead_bytes


def with_overheads(parts: dict, hw) -> dict:
    """The allocated parts of `peak` plus its two overhead terms, named: their sum is the peak."""
    allocated = sum(parts.values())
    return {**parts, "fragmentation": allocated * hw.memory_fragmentation,
            "framework_overhead": hw.memory_overhead_bytes}


def allocatable(hw) -> float:
    """The largest allocation whose peak fits in HBM (the inverse of `peak`)."""
    return (hw.hbm_bytes - hw.memory_overhead_bytes) / (1 + hw.memory_fragmentation)


def optimizer_step_s(params_per_device, training, hw):
    """The optimizer step: HBM-bound, optimizer_step_bytes moved per parameter it updates."""
    return (training.optimizer_step_bytes * params_per_device
            / (hw.hbm_bytes_per_s * hw.memory_efficiency))


def optimizer_step_for(p_dense, p_expert, dp: int, ep: int, cp: int, z: int, training, hw):
    """The optimizer step of a stage: ZeRO (z >= 1) shards the update over the replicas."""
    return optimizer_step_s(per_device(p_dense, p_expert, dp, ep, cp, z >= 1), training, hw)


def tied_embedding_params(model, graph, tp: int) -> float:
    """The word embedding a tied LM head shares (Megatron-LM, Shoeybi et al. 2019), per device of
    a tp group: V * h / tp; 0 for untied models. The head's layer counts a copy of it, so
    (a) a stage holding both the embedding and the head keeps one copy (subtract it), and
    (b) with p > 1 the first and the last stage all-reduce its gradient (the embedding group)."""
    return model.vocab_size * model.hidden_size / tp if graph.tied_embeddings else 0.0
