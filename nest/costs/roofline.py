"""One layer-graph operator x hardware -> forward and backward seconds (analytical roofline).

Per operator (Williams, Waterman & Patterson 2009, "Roofline"):
    time = max(FLOPs / (peak * efficiency), bytes / (HBM bandwidth * memory_efficiency)) + overhead
Matmul efficiency grows with the size of one GEMM and saturates (small GEMMs under-fill the
tensor cores / MXUs): eff(F) = matmul_efficiency * F / (F + F_half), F_half from the hardware file.
Attention runs at `attention_efficiency`; elementwise/norm operators are bandwidth-bound.
A hardware file that names measured profiles (`profile:`, e.g. H100) prices operators from them
instead (nest.costs.profiled), with this roofline as the fallback for shapes not measured;
nest.costs.table sums the operators of each layer into the cost table.

Imports: roofline <- profiled <- table (no cycle). CostTable and the per-layer names used to live
here; they are still importable from this module (resolved lazily by `__getattr__`, since
nest.costs.table imports this module) until every caller imports them from nest.costs.table.
"""

from __future__ import annotations

from nest.graph.layer_graph import Op
from nest.specs import HardwareSpec


def _compute_time(hw: HardwareSpec, op: Op, flops: float, nbytes: float, kernels: int) -> float:
    if op.kind == "matmul":
        per_gemm = flops / max(kernels, 1)
        eff = hw.matmul_efficiency * per_gemm / (per_gemm + hw.matmul_half_efficiency_flops)
    elif op.kind == "attention":
        eff = hw.attention_efficiency
    else:
        eff = 1.0
    t_flops = flops / (hw.peak_flops_per_s * eff) if flops > 0 else 0.0
    t_bytes = nbytes / (hw.hbm_bytes_per_s * hw.memory_efficiency)
    return max(t_flops, t_bytes) + kernels * hw.kernel_overhead_s


def op_times(hw: HardwareSpec, op: Op) -> tuple[float, float]:
    """(forward, backward) seconds of all `count` instances of one operator."""
    fwd = _compute_time(hw, op, op.fwd_flops, op.fwd_bytes, 1)
    bwd_kernels = 2 if op.kind in ("matmul", "attention") else 1  # dX and dW GEMMs
    bwd = _compute_time(hw, op, op.bwd_flops, op.bwd_bytes, bwd_kernels)
    return fwd * op.count, bwd * op.count
