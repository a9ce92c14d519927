"""Megatron-Core's MoE layer as it runs, the terms the traced graph does not hold: the dropless
token dispatcher's device-to-host wait (priced as a launch queue), the busiest expert-parallel
rank's expert compute under routing imbalance, and the experts' output-bias loop. Used by
nest.costs.table.layer_times; sources in each docstring, sizes in docs/modeling.md
("The MoE layer as Megatron-Core runs it").

Imports: profiled <- moe_time <- table.
"""

from __future__ import annotations

from collections.abc import Mapping

from nest.costs.profiled import BYTES
from nest.graph.layer_graph import LayerCost, Op

MOE_SORT = "moe_local_sort"  # the receiving side's local-expert sort (table.moe_local_sort_op)


# ---- the dropless dispatcher's device-to-host synchronisation --------------------------------
# Megatron-Core's dropless token dispatchers need the routing counts on the host (split sizes of
# the all-to-all, the output buffer's size): once per MoE layer forward the host waits for the
# device. MoEAlltoAllTokenDispatcher (alltoall): the counts are copied on a side stream at
# `cuda_dtoh_point` "before_permutation_1" and the host waits at `cuda_sync_point`
# "before_ep_alltoall" (preprocess / _maybe_dtoh_and_synchronize), after it has issued the
# permutation 1 kernel, which the GPU runs while the host waits; HybridEP (flex dispatcher):
# HybridEPDispatch.forward calls dispatch_with_permute with non_blocking = False when the
# number of permuted tokens is unknown (dropless), nothing queued behind the wait (fused_a2a.py).
# With the expert inputs padded to capacity (--moe-pad-expert-input-to-capacity) both know the
# sizes on the host and do not wait (drop_and_pad). megatron-core 0.16 (the 26.02.01 container's
# Megatron-LM 9ed8b0c) and 0.18.0rc (26.04.01's 4415119): token_dispatcher.py, fused_a2a.py;
# only the alltoall dispatcher's backward knows its split sizes already (saved), so backward
# does not wait. A layer's backward and a layer without a wait keep the per-layer host floor.

# the graph's operators that decide the routing; the wait follows the last of them (the
# closed-form graph has the router GEMM only, the torch.fx graph also its top-k `moe_route`)
SYNC_AFTER = ("router", "moe_route")


def _sync_index(names: list[str]) -> int | None:
    """Position just after the routing (the wait's place in the layer), None without it."""
    at = [i for i, n in enumerate(names) if n in SYNC_AFTER]
    return at[-1] + 1 if at else None


def dispatch_sync_queued(ops, dispatcher: str) -> int | None:
    """None if the layer has no routed experts (no wait), else the operator calls issued after
    the device-to-host copy and before the wait, which the GPU runs while the host waits: the
    alltoall dispatcher's permutation 1 (the graph's moe_permute, 1 call), none under HybridEP
    (the permutation runs inside its dispatch, after the wait)."""
    names = [op.name for op in ops]
    if _sync_index(names) is None or not any(n.startswith("expert_") for n in names):
        return None
    return 1 if dispatcher == "alltoall" and "moe_permute" in names else 0


def synced_segment(ops, per_op: Mapping) -> list[tuple[float, int]]:
    """(forward seconds, calls) of the operators between one wait and the next, in the order the
    host issues them: those after the routing (SYNC_AFTER), then (the next layer, alike) those
    up to it. The local-expert sort's two calls go before the first expert GEMM and after the
    last."""
    names = [op.name for op in ops if op.name != MOE_SORT]
    calls = {op.name: op.count for op in ops}
    k = _sync_index(names)
    order = names[k:] + names[:k]
    out = []
    for name in order:
        if MOE_SORT in per_op and name == "expert_gate_up":
            out.append((per_op[MOE_SORT][0] / 2, 1))
        out.append((per_op[name][0], calls[name]))
        if MOE_SORT in per_op and name == "expert_down":
            out.append((per_op[MOE_SORT][0] / 2, 1))
    return out


def launch_queue_s(segment: list[tuple[float, int]], host_s: float, queued: int = 0) -> float:
    """Seconds from the end of a wait to the GPU's end of `segment` ((seconds, calls) per
    operator, in issue order; each call of an operator runs seconds / calls) when the host issues
    a call every host_s and the GPU runs them in order (a stream is a FIFO): the first `queued`
    calls were issued before the wait and run at once. Call i (1-based) cannot start before the
    host issues it, (i - queued) host_s after the wait, so the end is the largest of
    (i - queued) host_s + the GPU seconds of calls i.. (and the GPU seconds of them all): the
    GPU seconds plus `wait_idle_s`.
    A stack of layers that each wait once runs a layer per max(this, calls x host_s): a host
    that arrives at the wait after the device has no wait (tests/test_moe_sync.py simulates
    it call by call)."""
    return sum(s for s, _ in segment) + wait_idle_s(segment, host_s, queued)


def wait_idle_s(segment: list[tuple[float, int]], host_s: float, queued: int = 0) -> float:
    """The GPU's idle seconds in `launch_queue_s`: the largest of (i - queued) host_s less the
    GPU seconds of calls before i, and 0 (exactly 0 when the queued calls cover the host's
    first call and the GPU stays ahead)."""
    idle, before, i = 0.0, 0.0, 0
    for s, n in segment:
        for _ in range(n):
            i += 1
            idle = max(idle, (i - queued) * host_s - before)
            before += s / n
    return idle


EXPERT_BIAS = "expert_bias"
# bytes per element of the experts' output that the bias loop moves, forward and backward alike
# (BF16; the router's dtype, moe_router_dtype unset in the gpt-oss recipes, for the probs):
# forward b * p writes 2, t + b p reads 4 and writes 2, torch.cat reads 2 and writes 2 (the
# final .to() is a no-op in the same dtype); backward the two products' adjoints g p and g b
# each write 2 and their reductions (to the bias, to the probs) read them again with g: 12
EXPERT_BIAS_BYTES = 12.0


def moe_expert_bias_op(cost: LayerCost, expert_bias: bool) -> tuple[Op, ...]:
    """The experts' output bias as Megatron-Core's TEGroupedMLP adds it (add_bias_linear: its
    linear_fc2 is built with skip_bias_add = True, and `_apply_bias` adds each local expert's
    bias weighted by the routing probabilities in a Python loop, then concatenates:
    torch.cat([t + b * p for each expert]); experts.py in megatron-core 0.16 (9ed8b0c) and
    0.18.0rc (4415119), the unfused path: Megatron-Bridge's perf overrides turn the TE op fuser
    off). () without expert biases (ModelSpec.linear_bias) or experts; else one memory-bound
    op of 2 E + 1 calls (E local experts: a multiply and an add each, one concatenation)
    moving EXPERT_BIAS_BYTES per output element (the expert_down GEMM's m n E) each phase."""
    down = [op for op in cost.ops if op.name == "expert_down"]
    if not expert_bias or not down:
        return ()
    d = down[0]
    calls = 2 * d.count + 1
    per_call = EXPERT_BIAS_BYTES * d.shape[0] * d.shape[1] * d.count / calls
    return (Op(EXPERT_BIAS, "memory", 0.0, 0.0, per_call, per_call, (), calls),)


EXPERT_CLAMP = "expert_clamp"
# Megatron-Core's clamped GLU (weighted_bias_quick_geglu_impl with clamp_value set, as gpt-oss's
# activation_func_clamp_value 7.0; megatron/core/fusions/fused_bias_geglu.py in megatron-core
# 0.15.0, 0.16 (9ed8b0c) and 0.18.0rc (4415119)) clamps the two halves of the experts' fc1
# output x [T, 2f] outside the fused activation, in eager PyTorch:
#   torch.cat((x_glu.clamp(max=c), x_linear.clamp(min=-c, max=c)), -1)
# Forward: two clamps (each reads and writes a half) and the concatenation (reads and writes x):
# 3 kernels, 4 |x| bytes. Backward, as autograd runs it (the aten calls traced by torch's
# profiler, tests/test_moe_clamp.py): CatBackward0 narrows (views, no kernel); ClampBackward1
# of x_linear runs ge, le, logical_and_ (masks of 1 byte per element) and where, of x_glu le and
# where; SplitBackward0 (chunk) concatenates the two gradients: 7 kernels, 7.5 |x| bytes
# (per half of n elements: 14 n and 8 n bytes; the concatenation 8 n; |x| = 4 n).
CLAMP_FWD_BYTES = 4.0  # per byte of x
CLAMP_BWD_BYTES = 7.5
CLAMP_FWD_KERNELS = 3


def moe_expert_clamp_op(cost: LayerCost, clamp: bool) -> tuple[Op, ...]:
    """The experts' GLU input clamp as Megatron-Core runs it (CLAMP_* above; gpt-oss,
    ModelSpec.glu_clamp): () without a clamp or experts; else one memory-bound op over the
    expert_gate_up GEMM's output (m x n per local expert, BF16), CLAMP_FWD_BYTES / _BWD_BYTES
    per byte of it, in CLAMP_FWD_KERNELS calls (the backward's 7 kernels priced as 3 calls'
    launches: 4 x kernel_overhead_us less, under 0.3% of a gpt-oss layer)."""
    up = [op for op in cost.ops if op.name == "expert_gate_up"]
    if not clamp or not up:
        return ()
    u = up[0]
    x = BYTES * u.shape[0] * u.shape[1] * u.count
    n = CLAMP_FWD_KERNELS
    return (Op(EXPERT_CLAMP, "memory", 0.0, 0.0, CLAMP_FWD_BYTES * x / n,
               CLAMP_BWD_BYTES * x / n, (), n),)


def busiest_rank_ops(cost: LayerCost, ops) -> tuple[str, ...]:
    """The operators that run on the tokens an expert-parallel rank receives: the experts (GEMMs
    and activation) and the local-expert sort; () without an expert-parallel all-to-all. Their
    times scale with the tokens, so on the busiest rank by the routing imbalance
    (TrainingSettings.moe_routing_imbalance, as its all-to-all bytes in
    nest.costs.groups.ep_a2a_bytes), and every rank waits for it at the combine all-to-all."""
    if not any(c.kind == "all_to_all" and c.group == "ep" for c in cost.collectives):
        return ()
    return tuple(op.name for op in ops if op.name.startswith("expert_") or op.name == MOE_SORT)
