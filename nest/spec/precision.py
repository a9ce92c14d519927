"""Training precision (compute dtype, parameters, gradients, optimizer states) -> bytes per
parameter, the GEMMs that run in FP8, and the matching Megatron-LM arguments.

One declared setting (`precision:` in config/training.yaml, a figure's or a plan's override):
    compute            bf16 | fp8 (Transformer Engine: --fp8-format, --fp8-recipe)
    params             bf16 | fp32     model weights (--bf16; fp32 keeps no separate master copy)
    grad_reduce        fp32 | bf16     DDP gradient buffer and its collectives
                                       (bf16: --grad-reduce-in-bf16)
    main_grads         fp32 | bf16     the optimizer's gradient (--main-grads-dtype)
    main_params        fp32 | fp16     master weights (--main-params-dtype)
    exp_avg, exp_avg_sq fp32 | fp16 | bf16 | fp8   Adam moments (--exp-avg-dtype, --exp-avg-sq-dtype)
    fp8_param_gather   keep the FP8 GEMM weights as the model weights and all-gather them in FP8
The defaults are Megatron-LM's for --bf16 (and the paper reproduction's): bf16 weights, fp32
gradient buffer reduced in fp32, fp32 master weights and moments (18 B per parameter without the
distributed optimizer; megatron/training/theoretical_memory_usage.py, num_bytes_per_parameter).
The distributed optimizer's sharding is the plan's ZeRO stage (1 = --use-distributed-optimizer:
master weights and moments sharded over the data-parallel ranks; 2 / 3 shard gradients and
weights too), chosen per stage by the planners, so it is not a second setting here.

Megatron-LM rules (NVIDIA/Megatron-LM @ d98e8a6, megatron/training/arguments.py lines 1203-1217 and
megatron/core/optimizer/optimizer_config.py lines 433-479), enforced by `check`:
  * bf16 reduces gradients in fp32 unless --grad-reduce-in-bf16, or main_grads_dtype is bf16
    (then accumulate_allreduce_grads_in_fp32 stays False): main_grads bf16 needs grad_reduce bf16.
  * main_grads / main_params / exp_avg / exp_avg_sq other than fp32 need
    --use-precision-aware-optimizer (Transformer Engine's FusedAdam), Adam only.
  * --fp8-param-gather needs the distributed optimizer or FSDP (ZeRO >= 1; checked on the plan by
    nest.problem.evaluate / nest.interfaces.export, not here).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from nest.common.errors import SpecError

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
# The GEMMs Transformer Engine runs in FP8 under Megatron-Core's TE layer spec: linear_qkv
# (TELayerNormColumnParallelLinear), linear_proj (TERowParallelLinear), linear_fc1 / linear_fc2 and
# the grouped expert GEMMs (megatron/core/models/gpt/gpt_layer_specs.py). What stays BF16: core
# attention (TEDotProductAttention, unless --fp8-dot-product-attention), the LM head
# (tensor_parallel.ColumnParallelLinear, megatron/core/models/gpt/gpt_model.py line 272, FP8 only
# for mxfp8 with fp8_output_proj), the MoE router (megatron/core/transformer/moe/router.py,
# router dtype), the embedding lookup, norms, softmax and activations. Names: nest.graph ops.
FP8_GEMMS = frozenset({"qkv", "out_proj", "mlp_up", "mlp_gate_up", "mlp_down",
                       "expert_gate_up", "expert_down"})
# Transformer Engine caches each FP8 GEMM weight across the micro-batches of a step
# (is_first_microbatch, set by Megatron-Core's schedules) as FP8 data plus its FP8 transpose for the
# backward GEMMs on Hopper (Float8Tensor row- and column-wise data): 1 + 1 bytes per parameter
# beside the BF16 weight. With fp8_param_gather the FP8 copy *is* the model weight (no BF16 one).
FP8_CACHE_BYTES = 2
FP8_RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8")


@dataclass(frozen=True)
class Precision:
    compute: str = "bf16"
    fp8_format: str = "hybrid"  # e4m3 | hybrid (e4m3 forward, e5m2 gradients)
    fp8_recipe: str = "delayed"  # delayed | tensorwise (current scaling) | blockwise | mxfp8
    fp8_param_gather: bool = False
    params: str = "bf16"
    grad_reduce: str = "fp32"
    main_grads: str = "fp32"
    main_params: str = "fp32"
    exp_avg: str = "fp32"
    exp_avg_sq: str = "fp32"

    @property
    def fp8(self) -> bool:
        return self.compute == "fp8"

    @property
    def precision_aware_optimizer(self) -> bool:
        """Megatron-LM's --use-precision-aware-optimizer: needed for any optimizer dtype other
        than fp32 (optimizer_config.py lines 467-479)."""
        return any(getattr(self, k) != "fp32"
                   for k in ("main_grads", "main_params", "exp_avg", "exp_avg_sq"))

    # -- bytes per parameter ----------------------------------------------------------------------
    @property
    def weight_bytes(self) -> int:
        """Model weights (the compute copy)."""
        return DTYPE_BYTES[self.params]

    @property
    def grad_buffer_bytes(self) -> int:
        """Megatron's DDP gradient buffer (param.main_grad): fp32 when it accumulates and reduces
        in fp32, else the parameter dtype (megatron/core/distributed/param_and_grad_buffer.py);
        its reduce-scatter / all-reduce moves these bytes."""
        return DTYPE_BYTES[self.grad_reduce]

    @property
    def gather_bytes(self) -> int:
        """Bytes per parameter of the weight all-gathers (ZeRO >= 1): FP8 with fp8_param_gather.
        (Approximation: the embedding, norms and LM head, which stay BF16, are gathered at 1 B
        too; they are a few per cent of a large model's parameters.)"""
        return 1 if self.fp8 and self.fp8_param_gather else self.weight_bytes

    @property
    def main_grad_copy_bytes(self) -> int:
        """The optimizer's fp32 copy of its gradient shard when the buffer is bf16: the
        distributed optimizer sets shard_main_param.grad = shard_model_grad.float()
        (megatron/core/optimizer/distrib_optimizer.py, _copy_model_grads_to_main_grads; a no-op
        on an fp32 buffer); the precision-aware optimizer reads the buffer as decoupled_grad
        (no copy) unless FP8 with a recipe other than delayed and fp32 main params."""
        if self.grad_buffer_bytes == DTYPE_BYTES[self.main_grads]:
            return 0
        no_copy = self.precision_aware_optimizer and (
            self.main_params != "fp32" or not self.fp8 or self.fp8_recipe == "delayed")
        return 0 if no_copy else DTYPE_BYTES[self.main_grads]

    @property
    def master_bytes(self) -> int:
        """Master weights: none when the model weights are fp32 themselves; with the
        precision-aware optimizer and bf16 weights Transformer Engine's FusedAdam stores only the
        16-bit remainder of an fp32 master (store_param_remainders, default True since TE 2.1;
        optimizer_config.py lines 190-193)."""
        if self.params == "fp32":
            return 0
        if (self.main_params == "fp32" and self.precision_aware_optimizer
                and self.params == "bf16"):
            return 2
        return DTYPE_BYTES[self.main_params]

    def optimizer_state_bytes(self, optimizer: str) -> int:
        """Master weights and moments (Adam: exp_avg, exp_avg_sq; SGD: momentum in exp_avg's
        dtype). Defaults: Adam 12 (Rajbhandari et al. 2020, K = 12), SGD 8."""
        moments = DTYPE_BYTES[self.exp_avg]
        if optimizer == "adam":
            moments += DTYPE_BYTES[self.exp_avg_sq]
        return self.master_bytes + moments

    def optimizer_step_bytes(self, optimizer: str) -> int:
        """HBM bytes one fused optimizer step moves per parameter: read and write the master (or
        the weights themselves when there is none) and the moments, read the main gradient,
        write the compute weights from the master (read master + write weights), zero the
        gradient buffer. Defaults: Adam 2 x 12 + 4 + (4 + 2) + 4 = 38, SGD 2 x 8 + 4 + 6 + 4 = 30
        (nest.spec.settings.OPTIMIZER_STEP_BYTES; measured ~40 on H100, profiles/h100_sxm)."""
        master = self.master_bytes
        state = self.optimizer_state_bytes(optimizer) + (0 if master else self.weight_bytes)
        copy = master + self.weight_bytes if master else 0
        grad = DTYPE_BYTES[self.main_grads] if self.main_grad_copy_bytes == 0 else (
            self.grad_buffer_bytes + 2 * self.main_grad_copy_bytes)  # cast: read, write, read
        return 2 * state + grad + copy + self.grad_buffer_bytes

    def fp8_cache_bytes(self) -> int:
        """Extra bytes per FP8-GEMM parameter that Transformer Engine keeps across a step."""
        return FP8_CACHE_BYTES if self.fp8 and not self.fp8_param_gather else 0

    def with_(self, **kw) -> "Precision":
        return replace(self, **kw)


_CHOICES = {"compute": ("bf16", "fp8"), "fp8_format": ("e4m3", "hybrid"),
            "fp8_recipe": FP8_RECIPES, "params": ("bf16", "fp32"),
            "grad_reduce": ("fp32", "bf16"), "main_grads": ("fp32", "bf16"),
            "main_params": ("fp32", "fp16"), "exp_avg": ("fp32", "fp16", "bf16", "fp8"),
            "exp_avg_sq": ("fp32", "fp16", "bf16", "fp8")}


def precision_from_dict(d: dict | None, where: str, base: Precision | None = None) -> Precision:
    """A `precision:` mapping (training.yaml, a figure, a plan) over `base`, checked."""
    base = base or Precision()
    if not d:
        return base
    known = {f.name for f in fields(Precision)}
    for k, v in d.items():
        if k not in known:
            raise SpecError(f"{where}: key 'precision.{k}': unknown (known: "
                            f"{', '.join(sorted(known))})")
        if k in _CHOICES and v not in _CHOICES[k]:
            raise SpecError(f"{where}: key 'precision.{k}': {v!r} is not one of "
                            f"{list(_CHOICES[k])}")
    p = replace(base, **d)
    check(p, where)
    return p


def check(p: Precision, where: str, optimizer: str = "adam", hardware=None) -> None:
    """Megatron-LM's own validation of these settings (module docstring), and FP8 on hardware
    that has it; SpecError naming the key."""
    if p.main_grads == "bf16" and p.grad_reduce == "fp32":
        raise SpecError(f"{where}: key 'precision.main_grads': bf16 main gradients need "
                        f"grad_reduce: bf16 (Megatron-LM reduces in fp32 only with fp32 main "
                        f"gradients: arguments.py, accumulate_allreduce_grads_in_fp32)")
    if p.params == "fp32" and (p.compute != "bf16" or p.precision_aware_optimizer
                               or p.grad_reduce != "fp32"):
        raise SpecError(f"{where}: key 'precision.params': fp32 weights train in fp32: no fp8 "
                        f"compute, bf16 gradients or low-precision optimizer states")
    if p.precision_aware_optimizer and optimizer != "adam":
        raise SpecError(f"{where}: key 'precision': optimizer dtypes other than fp32 need "
                        f"--use-precision-aware-optimizer, which supports adam only "
                        f"(optimizer_config.py)")
    if p.fp8_param_gather and not p.fp8:
        raise SpecError(f"{where}: key 'precision.fp8_param_gather': needs compute: fp8")
    if hardware is not None and p.fp8 and not hardware.peak_fp8_flops_per_s:
        raise SpecError(f"{where}: key 'precision.compute': fp8 on {hardware.name}, which has no "
                        f"FP8 tensor cores (no peak_fp8_TFLOPs in its hardware file)")


def precision_args(training) -> list[str]:
    """The Megatron-LM arguments of `training.precision` (names checked against
    NVIDIA/Megatron-LM @ d98e8a6: megatron/training/arguments.py --grad-reduce-in-bf16 line 3053,
    --use-distributed-optimizer 3156, --use-precision-aware-optimizer and the dtype flags
    3667-3684, --fp8-param-gather 2016; --bf16, --fp8-format and --fp8-recipe are generated from
    ModelParallelConfig.bf16 and TransformerConfig.fp8 / fp8_recipe). --use-distributed-optimizer
    follows the plan's ZeRO stage (nest.interfaces.export)."""
    p = training.precision
    a: list[str] = []
    if p.params == "bf16":
        a.append("--bf16")
    if p.fp8:
        a += ["--fp8-format", p.fp8_format, "--fp8-recipe", p.fp8_recipe]
        if p.fp8_param_gather:
            a.append("--fp8-param-gather")
    if p.grad_reduce == "bf16":
        a.append("--grad-reduce-in-bf16")
    if p.precision_aware_optimizer:
        a.append("--use-precision-aware-optimizer")
        for key, flag in (("main_grads", "--main-grads-dtype"),
                          ("main_params", "--main-params-dtype"),
                          ("exp_avg", "--exp-avg-dtype"), ("exp_avg_sq", "--exp-avg-sq-dtype")):
            if getattr(p, key) != "fp32":
                a += [flag, getattr(p, key)]
    return a
