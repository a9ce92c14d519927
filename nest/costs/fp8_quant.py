"""One FP8 GEMM x Transformer Engine's FP8 recipe -> the time of its quantization kernels.

Transformer Engine (TE) casts a linear layer's BF16 input to FP8 before the forward GEMM and its
output gradient before the backward GEMMs; the weights' FP8 copies are cached across
micro-batches (nest.spec.precision.FP8_CACHE_BYTES), so their cast is once per step and not
counted here. Every kernel below is bandwidth-bound: its bytes at the streaming bandwidth
(nest.costs.roofline.streaming_s) plus one launch (hardware `kernel_overhead_us`) each; an op's
`count` instances (local experts) pay all of it `count` times.

Cast (every recipe; TE v1.8 `module/base.py` / v2.9 `module/base.py`
`TransformerEngineBaseModule.grad_output_preprocess`, v2.9 `distributed.py` `_all_gather_fp8`):
* the input X[m, k]: one cast-transpose kernel (the FP8 copy for the forward GEMM and its
  transpose for the weight-gradient GEMM): read 2 m k, write m k + m k bytes;
* the output gradient dY[m, n]: likewise 4 m n bytes, except where it is all-gathered over tp
  (the row-parallel out-projection and MLP-down under sequence parallelism): TE casts the
  rank's sequence shard to FP8 without a transpose (read 2 m n / tp, write m n / tp), all-gathers
  the FP8 shard ("we cannot directly gather the transposed fp8 tensor", `_all_gather_fp8`), and
  transposes the gathered FP8 copy for the weight-gradient GEMM (read m n, write m n; v1.8
  `tex.fp8_transpose`, v2.9 `update_usage(columnwise_usage=True)` in `module/linear.py`
  `_Linear.backward`): 3 m n / tp + 2 m n bytes in two kernels.

Current scaling (Megatron-LM --fp8-recipe tensorwise, TE `Float8CurrentScaling`, "FP8-CS"; TE
v2.9 `pytorch/csrc/quantizer.cpp` `Float8CurrentScalingQuantizer::quantize_impl`) runs, per
quantized tensor, `nvte_compute_amax_with_config` (one read of the BF16 tensor), the amax
all-reduce over the tp group when the quantizer has `with_amax_reduction`, then
`nvte_compute_scale_from_amax` (one small kernel), then the cast; delayed scaling casts in one
pass with the previous steps' amax. Every current-scaling quantization first zeroes its amax,
one more launch (`ZERO_AMAX_KERNELS`): the amax pass's `launch_amax_kernel` starts with
`zero_amax_kernel<<<1, 1>>>` (v2.9-v2.16 `common/recipe/current_scaling.cu`; v2.2-v2.5 a
`cudaMemsetAsync` of the amax in the same place), and a TE norm that hands over its amax zeroes
it before the norm kernel (`Float8CurrentScalingQuantizer::create_unquantized_tensor_with_amax`:
`amax.zero_()`, v2.9-v2.16 `pytorch/csrc/quantizer.cpp`). So under current scaling a quantized
tensor costs 4 kernels (zero, amax, scale, cast) where TE computes its amax, 3 where a norm
hands it over (zero, scale, cast; the norm kernel itself is the graph's). `quantize_with_amax` skips the amax kernel: only a TE norm
(`extensions/normalization.cpp`, FUSED_NORM_AMAX_FP8, the norm of
TELayerNormColumnParallelLinear: the QKV and MLP-up inputs, NORM_FED) and TE's own activations
(`extensions/activation.cpp`, FUSED_ACTIVATION_AMAX_FP8; Megatron-Core's MLP runs its own
bias_swiglu unless use_te_activation_func, so not under its TE layer spec) hand over their amax.
So the out-projection, MLP-down and expert GEMMs' inputs and every output gradient run the amax
pass (over the tensor the cast reads: the sequence shard for a gathered output gradient), and
every quantization runs the scale kernel; the expert GEMMs (TE GroupedLinear) quantize expert by
expert under current scaling (`extensions/cast.cpp` `multi_tensor_quantize_impl`: a fused
multi-tensor kernel for delayed scaling only, through v2.17). The amax all-reduce (`amax_reductions`; priced with the
tp group's collectives in nest.costs.groups) runs where TE sets `with_amax_reduction` (v2.9
`module/linear.py` and `module/layernorm_linear.py` `_customize_quantizers_float8_current_
scaling`): the column-parallel inputs in forward and the row-parallel output gradients in
backward, under sequence parallelism. Blockwise and MXFP8 recipes scale inside the cast kernel
and are priced as delayed.
"""

from __future__ import annotations

from nest.costs.roofline import streaming_s
from nest.graph.layer_graph import COLUMN_PARALLEL, ROW_PARALLEL, LayerCost, Op
from nest.spec.catalog import HardwareSpec
from nest.spec.precision import FP8_GEMMS

CURRENT_SCALING = ("tensorwise",)  # the recipes that run TE's Float8CurrentScalingQuantizer
# inputs quantized from a TE norm's amax: the column-parallel ones (TELayerNormColumnParallel-
# Linear); the row-parallel output gradients are the ones all-gathered over tp under sp
NORM_FED = COLUMN_PARALLEL
AMAX_BYTES = 4  # one fp32 amax per quantized tensor
# launches of a current-scaling quantization besides its cast and amax pass: the amax's zeroing
# (zero_amax_kernel / amax.zero_()) and nvte_compute_scale_from_amax (module docstring)
ZERO_AMAX_KERNELS = 1
SCALE_KERNELS = 1


def fp8_cast_s(hw: HardwareSpec, op: Op, recipe: str = "delayed", tp: int = 1,
               sp: bool = False) -> tuple[float, float]:
    """(forward, backward) seconds of TE's quantization kernels around one FP8 GEMM X[m,k]
    W[n,k]^T (all `op.count` instances) under `recipe` (nest.spec.precision.FP8_RECIPES) on a
    variant with tensor parallelism `tp` and sequence parallelism `sp` (module docstring)."""
    m, n, k = op.shape[:3]
    launch = hw.kernel_overhead_s
    fwd = streaming_s(hw, 4.0 * m * k) + launch
    if sp and tp > 1 and op.name in ROW_PARALLEL:  # cast the shard, gather, transpose
        grad_read = 2.0 * m * n / tp
        bwd = streaming_s(hw, 1.5 * grad_read) + streaming_s(hw, 2.0 * m * n) + 2 * launch
    else:
        grad_read = 2.0 * m * n
        bwd = streaming_s(hw, 2.0 * grad_read) + launch
    if recipe in CURRENT_SCALING:
        fwd += (ZERO_AMAX_KERNELS + SCALE_KERNELS) * launch
        if op.name not in NORM_FED:
            fwd += streaming_s(hw, 2.0 * m * k) + launch  # the amax pass over the input
        # the output gradient: its amax pass, the amax's zeroing and the scale kernel
        bwd += streaming_s(hw, grad_read) + (1 + ZERO_AMAX_KERNELS + SCALE_KERNELS) * launch
    return fwd * op.count, bwd * op.count


def amax_reductions(cost: LayerCost, recipe: str, tp: int, sp: bool) -> tuple[int, int]:
    """(forward, backward) amax all-reduces over the tp group one layer runs per micro-batch
    (module docstring): one per FP8 column-parallel input in forward and per FP8 row-parallel
    output gradient in backward, under current scaling with sequence parallelism and tp > 1."""
    if recipe not in CURRENT_SCALING or not sp or tp <= 1:
        return 0, 0
    gemms = [op for op in cost.ops if op.kind == "matmul" and op.name in FP8_GEMMS]
    return (sum(op.count for op in gemms if op.name in COLUMN_PARALLEL),
            sum(op.count for op in gemms if op.name in ROW_PARALLEL))
