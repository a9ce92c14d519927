"""config/training.yaml -> TrainingSettings (global batch, optimizer, precision, schedule)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from nest.common.errors import SpecError
from nest.spec.precision import Precision, precision_from_dict
from nest.spec.catalog import config_dir, read_yaml, validate

# Bytes of optimizer state per parameter: mixed-precision Adam keeps fp32 master weights,
# momentum and variance (Rajbhandari et al. 2020, ZeRO, section 3.1: K = 12); SGD with momentum
# keeps fp32 master weights and momentum (8).
OPTIMIZER_STATE_BYTES = {"adam": 12, "sgd": 8}
# HBM bytes touched per parameter by one optimizer step (Megatron-LM with fp32 main gradients):
# fused Adam reads fp32 param, grad, m, v and writes param, m, v (7 x 4 = 28), the fp32 -> bf16
# weight copy reads 4 and writes 2 (6), zeroing the main gradient writes 4: 38 bytes. SGD with
# momentum: reads param, grad, momentum, writes param, momentum (20) + 6 + 4 = 30. Measured on an
# H100 block (profiles/h100_sxm/validation.md): PyTorch's Adam moves ~40 B/param.
OPTIMIZER_STEP_BYTES = {"adam": 38, "sgd": 30}


@dataclass(frozen=True)
class CostScale:
    """The cost model's own error as a knob (the `robustness` experiment, nest.experiments.robustness): every
    compute time is multiplied by `compute`, every communication time by `communication`, where
    they enter the cost tables, so every planner re-plans and the evaluator scores under the same
    perturbed model. 1.0 / 1.0 leaves every number as it is (exactly: x * 1.0 == x).
      compute: the layer table's forward, backward and recomputed forward (GEMMs, attention,
               memory-bound kernels and the host floor alike; nest.costs.table.CostTable) and the
               optimizer step (HBM-bound; nest.costs.memory.optimizer_step_s)
      communication: every network transfer: tp / cp / ep collectives, the data-parallel and
               ZeRO syncs, the tied-embedding all-reduce and pipeline point-to-point sends, by
               scaling the cluster's per-level bandwidths by 1 / k and latencies by k
               (nest.spec.catalog.ClusterSpec.with_comm_scale), so every alpha-beta line scales by k"""

    compute: float = 1.0
    communication: float = 1.0

    @property
    def unit(self) -> bool:
        return self.compute == 1.0 and self.communication == 1.0


def cost_scale_from_dict(d: dict | None, where: str) -> CostScale:
    """A `cost_scale:` mapping (schema-checked) -> CostScale; finite and > 0 (a schema's minimum
    lets NaN through)."""
    d = dict(d or {})
    for k, v in d.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or v <= 0:
            raise SpecError(f"{where}: key 'cost_scale.{k}': {v!r} must be a finite number > 0")
    return CostScale(**{k: float(v) for k, v in d.items()})


@dataclass(frozen=True)
class TrainingSettings:
    global_batch: int = 4096
    optimizer: str = "adam"
    # compute dtype, weights, gradients, optimizer states (nest.spec.precision; defaults: Megatron-LM's
    # --bf16 with fp32 gradient reduction and fp32 Adam states, 18 B per parameter)
    precision: Precision = Precision()
    schedule: str = "1f1b"
    graph_source: str = "torch_fx"  # how layer graphs are built: torch_fx | closed_form
    # how the evaluator prices the pipeline (nest.costs.pipeline): "paper" (m + p - 1)
    # max_j t_j, what the NEST solver optimises exactly; "critical_path" the tight closed form
    # (nest.costs.pipeline.critical_path_1f1b), "simulated" the discrete-event simulation (nest.costs.simulate)
    pipeline_time: str = "paper"
    # data-parallel gradient sync vs the last backward (nest.costs.pipeline.dp_sync_tail_s): "none"
    # (the paper's: after the flush), "stage" (after the stage's own last backward), "bucketed"
    # (also overlapping it, in buckets of dp_bucket_params parameters; Megatron-LM's default
    # bucket is 40 M parameters, PyTorch DDP's 25 MiB)
    dp_overlap: str = "none"
    dp_bucket_params: int = 40_000_000
    # the attention kernel (nest.graph.attention): "auto" (the hardware file's
    # attention_implementation), "flash" or "unfused"; time, memory and recomputation follow it
    attention: str = "auto"
    # tensor-parallel communication overlapped with the GEMMs (Transformer Engine userbuffers,
    # NeMo / Megatron-Bridge `tp_comm_overlap`; sequence-parallel stages; nest.costs.groups)
    tp_comm_overlap: bool = False
    # Transformer Engine's pipelined reduce-scatter overlap of the row-parallel linears' forward
    # (userbuffers `pipeline` method of proj_fprop / fc2_fprop): the GEMM in `tp_overlap_splits`
    # chunks, and the SMs its reduce-scatter kernels take from the attention out-projection's /
    # the MLP down projection's GEMM (`num_sm` with set_sm_margin; TE's defaults 4, 16, 16;
    # nest.costs.groups.tp_overlapped)
    tp_overlap_rs: str = "pipeline"  # TE's method for proj_fprop / fc2_fprop | "ring_exchange"
    tp_overlap_splits: int = 4
    tp_overlap_attn_sms: int = 16
    tp_overlap_mlp_sms: int = 16
    # SMs the backward's `bulk` all-gather / reduce-scatter kernels take from the QKV and MLP up
    # dgrad / wgrad GEMMs (TE's default: 16 with set_sm_margin; the NeMo / Megatron-Bridge
    # recipes set no margin there: 0)
    tp_overlap_bulk_sms: int = 16
    # the busiest expert-parallel rank's received tokens over the mean (>= 1; 1.0: balanced
    # routing): its all-to-all buffers grow by this factor (nest.costs.groups.ep_a2a_bytes)
    moe_routing_imbalance: float = 1.0
    # how the expert-parallel all-to-all runs (nest.network.hybrid_ep.DISPATCHERS): "alltoall"
    # (Megatron-Core's NCCL all-to-all dispatcher) or "hybridep" (the flex dispatcher's
    # HybridEP: each token crosses the inter-node network once per remote NVLink domain)
    moe_dispatcher: str = "alltoall"
    # expert inputs padded to capacity (Megatron-Core --moe-pad-expert-input-to-capacity with a
    # capacity factor): the dispatcher knows every size on the host and never waits for the
    # device; false: dropless, one wait per MoE layer forward (nest.costs.table)
    moe_pad_to_capacity: bool = False
    # rotary embeddings by Transformer Engine's fused kernel (Megatron-Core apply_rope_fusion);
    # false: the eager PyTorch path, which megatron-core >= 0.16 takes for YaRN with a
    # concentration factor != 1 such as gpt-oss's (nest.costs.rope)
    rope_fusion: bool = True
    # selective module recomputation (MODULE_RECOMPUTE in nest.costs.table): Megatron-Core's
    # --recompute-modules "layernorm" (the block's input and pre-MLP norms) and "moe_act" (the
    # experts' activation), and metaseq's "act" (the dense MLP's activation; not a Megatron-Core
    # module). Their forward re-runs in the backward; the norms' and the dense activation's
    # outputs are not kept (nest.costs.table.module_freed_bytes; moe_act's memory is not
    # credited, a conservative peak). Independent of a plan's `recompute` mode.
    recompute_modules: tuple[str, ...] = ()
    # the distributed optimizer's (ZeRO-1 / 2) all-gather of the updated weights overlapped with
    # the next batch's first forward, bucket by bucket (Megatron-LM --overlap-param-gather, NeMo
    # `overlap_param_sync`): only dp_sync_exposed_s(all-gather, first forward, buckets) stays
    # (nest.costs.stage.gather_exposed)
    param_gather_overlap: bool = False
    # the interleaved schedule's pipeline sends under compute (Megatron-Core overlap_p2p_comm:
    # Megatron-Bridge / NeMo set it for pp > 1 and vp > 1, Megatron-LM defaults to it): only the
    # warm-up forwards' and cool-down backwards' sends stay blocking
    # (nest.costs.pipeline.interleaved_busy; nest.costs.simulate); 1F1B and GPipe ignore it
    overlap_p2p_comm: bool = False
    # when a stage's unsharded gradient accumulation buffer exists (nest.costs.memory,
    # lazy_gradient_peak): "persistent" (Megatron-LM's contiguous buffer, allocated once and
    # held all step) or "lazy" (Meta's FSDP for Llama 3: a layer's FP32 unsharded main gradient
    # is created by its first backward of the step; under interleaving the activation peak comes
    # before the later chunks' first backwards)
    grad_buffer: str = "persistent"
    # the cost model perturbed: compute and communication times scaled (CostScale; 1.0 / 1.0:
    # the model as it is)
    cost_scale: CostScale = CostScale()
    # the share of HBM a plan of `nest plan` / `nest compare` leaves free (plans are searched on
    # (1 - memory_headroom) x HBM; the evaluator reports each stage's margin and warns below it).
    # 5%: docs/planning.md, "Memory headroom". The paper's figures plan on the whole HBM.
    memory_headroom: float = 0.05

    @property
    def weight_bytes_per_param(self) -> int:
        return self.precision.weight_bytes

    @property
    def grad_bytes_per_param(self) -> int:
        """The gradient buffer and its collectives (the reduce dtype)."""
        return self.precision.grad_buffer_bytes

    @property
    def optimizer_state_bytes(self) -> int:
        return self.precision.optimizer_state_bytes(self.optimizer)

    @property
    def optimizer_step_bytes(self) -> int:
        return self.precision.optimizer_step_bytes(self.optimizer)

    def with_precision(self, overrides: dict | None, where: str = "precision") -> "TrainingSettings":
        """These settings with a `precision:` mapping (a figure's or a plan's) applied."""
        if not overrides:
            return self
        return replace(self, precision=precision_from_dict(overrides, where, self.precision))

    def with_(self, **kw) -> "TrainingSettings":
        if "recompute_modules" in kw:
            kw["recompute_modules"] = tuple(kw["recompute_modules"])
        return replace(self, **kw)


def training_overrides(base: TrainingSettings, d: dict | None, where: str) -> TrainingSettings:
    """`base` with a mapping of training.yaml keys applied (a plan file's `training:`, the
    command line's flags): validated against nest/schemas/training.json, errors naming `where`
    and the key."""
    if not d:
        return base
    d = dict(d)
    validate(d, "training", where)
    out = base
    if "precision" in d:
        out = out.with_precision(d.pop("precision"), f"{where}: key 'precision'")
    if "cost_scale" in d:
        d["cost_scale"] = cost_scale_from_dict(d["cost_scale"], where)
    if "memory_headroom" in d:
        d["memory_headroom"] = float(d["memory_headroom"])
    return out.with_(**d)


def load_training(path=None) -> TrainingSettings:
    path = path or config_dir() / "training.yaml"
    d = read_yaml(path)
    validate(d, "training", str(path))
    prec = precision_from_dict(d.pop("precision", None), str(path))
    scale = cost_scale_from_dict(d.pop("cost_scale", None), str(path))
    if "recompute_modules" in d:
        d["recompute_modules"] = tuple(d["recompute_modules"])
    return TrainingSettings(**d, precision=prec, cost_scale=scale)
