"""One layer-graph operator x hardware -> forward and backward seconds (analytical roofline).

Per operator (Williams, Waterman & Patterson 2009, "Roofline"):
    time = max(FLOPs / (peak * efficiency), bytes / (HBM bandwidth * memory_efficiency)) + overhead
Matmul efficiency grows with the size of one GEMM and saturates (small GEMMs under-fill the
tensor cores / MXUs): eff(F) = matmul_efficiency * F / (F + F_half), F_half from the hardware file.
Each GEMM of a matmul (forward; dgrad and wgrad backward) is priced on its own shape; a batched
GEMM (shape m, n, k, batch: the unfused attention core) is one kernel over all its matrices.
Attention runs at `attention_efficiency`; elementwise/norm operators are bandwidth-bound, at
`elementwise_efficiency` of the HBM bandwidth (default: memory_efficiency).
A hardware file that names measured profiles (`profile:`, e.g. H100) prices operators from them
instead (nest.costs.profiled), with this roofline as the fallback for shapes not measured;
nest.costs.table sums the operators of each layer into the cost table.

Imports: roofline <- profiled <- table (no cycle). CostTable and the per-layer names used to live
here; they are still importable from this module (resolved lazily by `__getattr__`, since
nest.costs.table imports this module) until every caller imports them from nest.costs.table.
"""

from __future__ import annotations

import numpy as np

from nest.graph.layer_graph import Op
from nest.spec.catalog import HardwareSpec

BF16 = 2  # bytes per GEMM operand element


def gemm_time(hw: HardwareSpec, m, n, k, batch=1, peak: float | None = None, *,
              efficiency=None, half_flops=None, overhead=None):
    """One GEMM kernel Y[m, n] = X[m, k] W[k, n] (x batch, one launch), bf16 operands: compute at
    matmul_efficiency x F / (F + F_half) (small GEMMs under-fill the GPU), or its operand
    traffic at the streaming bandwidth, whichever is slower, plus one launch. (Tile and wave
    quantisation over the SMs was tried against the measured H100 GEMMs and fits them worse than
    this curve: README, "Fidelity".) Scalars or NumPy arrays (broadcast): the curve fit
    (nest.profiling.gemm_fit) prices many shapes and candidate (efficiency, half_flops,
    overhead) at once with this same formula; None takes the hardware file's value."""
    e = hw.matmul_efficiency if efficiency is None else efficiency
    fh = hw.matmul_half_efficiency_flops if half_flops is None else half_flops
    flops = 2.0 * m * n * k * batch
    eff = e * flops / (flops + fh)
    with np.errstate(divide="ignore", invalid="ignore"):  # an empty GEMM: no compute time
        t_flops = np.where(flops > 0, flops / ((peak or hw.peak_flops_per_s) * eff), 0.0)
    t_bytes = BF16 * batch * (m * k + k * n + m * n) / (hw.hbm_bytes_per_s * hw.memory_efficiency)
    out = np.maximum(t_flops, t_bytes) + (hw.kernel_overhead_s if overhead is None else overhead)
    return float(out) if np.ndim(out) == 0 else out


def streaming_s(hw: HardwareSpec, nbytes):
    """Seconds to move `nbytes` through HBM at the card's streaming bandwidth (hbm_bytes_per_s x
    memory_efficiency, the BabelStream-style copy rate the hardware file cites), no launch: the
    bandwidth term of a streaming kernel (Transformer Engine's casts, userbuffers' summing
    kernel)."""
    return nbytes / (hw.hbm_bytes_per_s * hw.memory_efficiency)


def elementwise_efficiency(hw: HardwareSpec) -> float:
    """The HBM share a memory-bound operator reaches: the hardware file's elementwise_efficiency
    (A100: fitted to Korthikanti et al. 2022's per-layer times, nest.profiling.layer_fit), else
    its streaming memory_efficiency."""
    e = hw.elementwise_efficiency
    return hw.memory_efficiency if e is None else e


def _compute_time(hw: HardwareSpec, op: Op, flops: float, nbytes: float, kernels: int) -> float:
    """An attention or memory-bound operator (GEMMs: `gemm_time`)."""
    eff = hw.attention_efficiency if op.kind == "attention" else 1.0
    t_flops = flops / (hw.peak_flops_per_s * eff) if flops > 0 else 0.0
    mem_eff = hw.memory_efficiency if op.kind == "attention" else elementwise_efficiency(hw)
    t_bytes = nbytes / (hw.hbm_bytes_per_s * mem_eff)
    return max(t_flops, t_bytes) + kernels * hw.kernel_overhead_s


def matmul_times(hw: HardwareSpec, op: Op, peak: float | None = None) -> tuple[float, float]:
    """(forward, backward) of one matmul op instance: Y = X W^T forward, dX = dY W and
    dW = dY^T X backward, each its own GEMM. Shape (m, n, k), or (m, n, k, batch) for a batched
    GEMM run as one kernel (nest.graph.attention's unfused core)."""
    m, n, k = op.shape[:3]
    batch = op.shape[3] if len(op.shape) > 3 else 1
    fwd = gemm_time(hw, m, n, k, batch, peak)
    bwd = gemm_time(hw, m, k, n, batch, peak) + gemm_time(hw, n, k, m, batch, peak)
    return fwd, bwd


def is_fp8_gemm(op: Op, compute: str = "bf16") -> bool:
    """Whether `op` runs as an FP8 GEMM under `compute` (nest.spec.precision.FP8_GEMMS: the linear
    layers Transformer Engine runs in FP8; attention, norms, the LM head stay BF16)."""
    from nest.spec.precision import FP8_GEMMS

    return compute == "fp8" and op.kind == "matmul" and op.name in FP8_GEMMS


def op_times(hw: HardwareSpec, op: Op, compute: str = "bf16") -> tuple[float, float]:
    """(forward, backward) seconds of all `count` instances of one operator; FP8 GEMMs
    (`is_fp8_gemm`) run against the FP8 peak of the hardware file."""
    if op.kind == "matmul":
        assert len(op.shape) >= 3, f"matmul {op.name} has no (m, n, k) shape"
        peak = None
        if is_fp8_gemm(op, compute):
            if not hw.peak_fp8_flops_per_s:
                raise ValueError(f"hardware {hw.name}: no FP8 peak (key 'peak_fp8_TFLOPs')")
            peak = hw.peak_fp8_flops_per_s
        fwd, bwd = matmul_times(hw, op, peak)
        return fwd * op.count, bwd * op.count
    fwd = _compute_time(hw, op, op.fwd_flops, op.fwd_bytes, 1)
    # attention backward: two launches (FlashAttention-2: the rowsum(dO * O) preprocessing and
    # the main backward kernel)
    bwd_kernels = 2 if op.kind == "attention" else 1
    bwd = _compute_time(hw, op, op.bwd_flops, op.bwd_bytes, bwd_kernels)
    return fwd * op.count, bwd * op.count
