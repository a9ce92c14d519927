"""Catalog YAML (model / hardware / cluster) -> frozen dataclasses in SI units, validated;
a Hugging Face config.json -> ModelSpec as well.

Human units (GB/s, GB, us, TFLOP/s) appear only in the hand-written YAML files and are converted
here, once. Every other module works in seconds, bytes, FLOPs and bytes per second.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from nest.common.atomic_io import write_text_atomic  # noqa: F401 - the one atomic writer, re-exported
from nest.common.errors import SpecError, short
from nest.common.inputs import (  # noqa: F401 - the input boundary, re-exported for its callers
    MAX_ALIAS_EXPANSION, MAX_JSON_BYTES, MAX_YAML_BYTES, SCHEMA_DIR, limit, load_json,
    load_schema, non_finite, parse_yaml, read_text, read_yaml, unique_pairs, validate)

GB = 1e9
GiB = 2**30
TFLOP = 1e12
US = 1e-6
# Size guards of the input boundary. The per-key ranges (devices, layers, batch, sequence length,
# widths, bandwidth, FLOP/s, HBM ...) live in nest/schemas/*.json, each a physical bound well
# beyond every published configuration, so that a file or a flag can never ask the harness for
# an astronomically large problem; `limit(kind, key)` reads them for the command line.
# The most devices a problem may use (64x the paper's largest, 1024; a plan's device ids,
# placements and collective groups are built per device): the schemas' num_devices maximum.
MAX_DEVICES = 65536
# Tokens in one micro-batch (mbs x seq_len): a traced tensor of attention scores holds
# mbs x heads x seq_len^2 elements and must stay within int64 (2^30 tokens is ~8000x the
# largest published micro-batch, Llama-3.1's 131072-token context at mbs 1).
MAX_MICROBATCH_TOKENS = 2**30


def config_dir() -> Path:
    """The catalog root: $NEST_CONFIG_DIR, else the repository's config/ next to the package.
    A $NEST_CONFIG_DIR that is not a folder is a SpecError naming it (not an empty catalog)."""
    env = os.environ.get("NEST_CONFIG_DIR")
    if not env:
        return Path(__file__).resolve().parent.parent.parent / "config"
    if not Path(env).is_dir():
        raise SpecError(f"NEST_CONFIG_DIR={short(env)}: no such folder (it names the catalog "
                        f"root holding models/, clusters/, hardware/, training.yaml)")
    return Path(env)


def shown(path) -> str:
    """A path as messages and results show it: relative to the working directory when below it
    (so a result does not depend on where the repository was cloned)."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)




def _resolve(kind_dir: str, name_or_path: str | os.PathLike) -> Path:
    """A catalog name (config/<kind_dir>/<name>.yaml) or a path to a YAML file."""
    s = str(name_or_path)
    if s.endswith((".yaml", ".yml")) or os.sep in s:
        return Path(s)
    path = config_dir() / kind_dir / f"{s}.yaml"
    if not path.exists():
        known = ", ".join(catalog_names(kind_dir)) or "(none)"
        what = kind_dir if kind_dir == "hardware" else kind_dir[:-1]
        raise SpecError(f"unknown {what} '{s}': no file {path}; known: {known}")
    return path


def catalog_names(kind_dir: str) -> list[str]:
    return sorted(p.stem for p in (config_dir() / kind_dir).glob("*.yaml"))


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParallelVariants:
    tp: tuple[int, ...] = (1,)
    sp: tuple[bool, ...] = (False,)
    ep: tuple[int, ...] = (1,)
    cp: tuple[int, ...] = (1,)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str  # bert | gpt | llama | mixtral
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    ffn_type: str  # gelu | swiglu
    vocab_size: int
    seq_len: int
    num_experts: int = 1
    top_k: int = 1
    causal: bool = True
    tied_embeddings: bool = False
    published_num_params: float | None = None
    rope_theta: float | None = None  # rotary base (HF rope_theta); None: 10000 where rope is used
    # the windowed layers' own rotary base, unscaled, where it is not the global layers' rope_theta
    # and rope_scaling (Gemma-3: rope_local_base_freq); 0: every layer rotates alike. No cost
    rope_local_theta: float = 0.0
    norm_eps: float | None = None  # LayerNorm / RMSNorm epsilon; None: 1e-5 (Megatron's default)
    parallel_variants: ParallelVariants = field(default_factory=ParallelVariants)
    source_file: str = ""
    # Architecture features of Hugging Face families (nest.graph.hf_spec); defaults = Llama / GPT.
    head_size: int = 0  # Q/K/V width per head when not hidden/heads (Gemma-2, Qwen3); 0: h/a
    qkv_bias: bool = False  # biases on the Q, K, V projections only (Qwen2)
    qk_norm: bool = False  # RMSNorm over each head's Q and K (Qwen3)
    sandwich_norm: bool = False  # a norm after attention and after the MLP too (Gemma-2)
    sliding_window: int = 0  # attention window in tokens of the layers in window_layers
    window_layers: tuple[int, ...] = ()  # 0-based block indices attending over the window
    attn_softcap: float = 0.0  # tanh soft-capping of attention scores (Gemma-2), fused on chip
    final_softcap: float = 0.0  # tanh soft-capping of the logits (Gemma-2)
    # a Hugging Face config's RoPE scaling ("llama3 factor=32.0 ..."): rotation frequencies only,
    # no cost (nest.graph.hf_spec); carried so that `nest export` states it or warns
    rope_scaling: str = ""
    # the share of each head's dimensions RoPE rotates (Hugging Face partial_rotary_factor:
    # Phi-4-mini 0.75; Megatron-LM --rotary-percent): no cost, carried for `nest export`
    rotary_percent: float = 1.0
    # numerics of a Hugging Face family that cost nothing here but that Megatron-LM's arguments
    # do not state (Gemma's embedding scale, ...): `nest export` warns with them
    numerics_notes: tuple[str, ...] = ()
    # how the router turns logits into the top-k weights, when not Megatron-LM's default (softmax
    # over the top k logits): space-separated "pre_softmax" (softmax over every expert, top k not
    # renormalised: Hugging Face norm_topk_prob false), "sigmoid", "expert_bias" (aux-loss-free
    # balancing), "scale=F", "groups=N", "group_topk=K". No cost; `nest export` states it
    router: str = ""
    # the load-balancing loss a Megatron-LM export trains with (no cost: every routing is priced
    # balanced): "aux_loss" (Switch / GShard), "seq_aux_loss" (DeepSeek-V2's loss per sequence),
    # "none"; "" = not stated (the export: Megatron-LM's recommended aux_loss at 1e-2)
    balance_loss: str = ""
    aux_loss_coeff: float = 0.0  # its coefficient (Hugging Face router_aux_loss_coef, aux_loss_alpha)
    shared_ffn_hidden_size: int = 0  # always-active shared expert(s) of an MoE layer, in total
    shared_expert_gate: bool = False  # sigmoid gate Linear(h, 1) on the shared expert (Qwen2-MoE)
    num_dense_layers: int = 0  # the first blocks of an MoE model with a dense MLP (DeepSeek)
    dense_ffn_hidden_size: int = 0  # their MLP width
    q_lora_rank: int = 0  # multi-head latent attention (DeepSeek-V2/V3): Q down-projection rank
    kv_lora_rank: int = 0  # MLA: compressed K/V rank (> 0 turns MLA on)
    qk_rope_head_dim: int = 0  # MLA: rotary part of each Q/K head (head_size = nope + rope)
    v_head_dim: int = 0  # MLA: V width per head
    qk_norm_full: bool = False  # the Q / K norm spans the whole projection, not a head (OLMo-2)
    pre_norm: bool = True  # a norm before attention and MLP (OLMo-2: after them only)
    linear_bias: bool = False  # biases on every linear: Q, K, V, out, router, experts (gpt-oss)
    attention_sinks: bool = False  # a learned sink logit per head in the softmax (gpt-oss)
    # the experts' GLU input clamp limit (gpt-oss: Hugging Face swiglu_limit 7.0, Megatron-Core's
    # activation_func_clamp_value); 0: none. Costs only: nest.costs.moe_time.moe_expert_clamp_op
    glu_clamp: float = 0.0
    mtp_layers: int = 0  # multi-token-prediction modules after the head (DeepSeek-V3)

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden_size // self.num_heads

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def q_hidden_size(self) -> int:
        return self.num_heads * self.head_dim

    def is_dense_block(self, i: int) -> bool:
        """Block i (0-based) has a dense MLP (all of them in a dense model)."""
        return not self.is_moe or i < self.num_dense_layers

    def window_of(self, i: int) -> int:
        """Attention window of block i in tokens (0: the whole sequence)."""
        return self.sliding_window if i in self.window_layers and self.sliding_window < \
            self.seq_len else 0

    @property
    def kv_hidden_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def has_dropout(self) -> bool:
        # BERT and GPT-3 train with dropout (Korthikanti et al. 2022 count its masks); Llama and
        # Mixtral train without (Touvron et al. 2023; Jiang et al. 2024).
        return self.family in ("bert", "gpt")

    @property
    def norm(self) -> str:
        return "layernorm" if self.family in ("bert", "gpt") else "rmsnorm"

    @property
    def learned_positions(self) -> bool:
        return self.family in ("bert", "gpt")


def model_from_dict(d: dict, where: str) -> ModelSpec:
    validate(d, "model", where)
    d = dict(d)
    pv = d.pop("parallel_variants", {}) or {}
    d.pop("source", None)
    d.setdefault("num_kv_heads", d["num_heads"])
    if "window_layers" in d:
        d["window_layers"] = tuple(d["window_layers"])
    if "numerics_notes" in d:
        d["numerics_notes"] = tuple(d["numerics_notes"])
    spec = ModelSpec(
        **d,
        parallel_variants=ParallelVariants(**{k: tuple(v) for k, v in pv.items()}),
        source_file=where,
    )
    _check_model(spec, where)
    return spec


def _check_model(m: ModelSpec, where: str) -> None:
    """What the schema cannot say: the shapes agree with each other and with every parallel
    variant the model declares (each variant's layers are built, so each must split evenly)."""
    def bad(key, text):
        raise SpecError(f"{where}: key '{key}': {text}")

    if m.hidden_size % m.num_heads and not m.head_size:
        bad("hidden_size", f"{m.hidden_size} is not a multiple of num_heads={m.num_heads}")
    if m.num_heads % m.num_kv_heads:
        bad("num_kv_heads", f"{m.num_kv_heads} must divide num_heads={m.num_heads}")
    if m.top_k > m.num_experts:
        bad("top_k", f"{m.top_k} exceeds num_experts={m.num_experts}")
    if m.is_moe and m.ffn_type == "gelu":
        bad("ffn_type", "'gelu' with num_experts > 1: experts are modelled as gated MLPs "
                        "(swiglu or geglu)")
    if m.family in ("llama", "mixtral"):  # rotary embeddings turn pairs of channels
        rot, key = ((m.qk_rope_head_dim, "qk_rope_head_dim") if m.is_mla
                    else (m.head_dim, "head_size" if m.head_size else "hidden_size"))
        if rot % 2:
            bad(key, f"the rotary head dimension is {rot}, odd; rotary position embeddings "
                     f"({m.family} family) need an even one")
    if m.is_mla and (m.qk_rope_head_dim < 1 or m.v_head_dim < 1
                     or m.head_size <= m.qk_rope_head_dim):
        bad("kv_lora_rank", "multi-head latent attention needs qk_rope_head_dim >= 1, "
                            "v_head_dim >= 1 and head_size > qk_rope_head_dim")
    if m.window_layers and max(m.window_layers) >= m.num_layers:
        bad("window_layers", f"block {max(m.window_layers)} does not exist (num_layers="
                             f"{m.num_layers})")
    if m.sliding_window and not m.causal:
        bad("sliding_window", "a sliding window is modelled for causal attention only")
    if m.num_dense_layers >= m.num_layers and m.is_moe:
        bad("num_dense_layers", f"{m.num_dense_layers} leaves no MoE block of {m.num_layers}")
    widths = (m.ffn_hidden_size, m.shared_ffn_hidden_size, m.dense_ffn_hidden_size)
    pv = m.parallel_variants
    for t in pv.tp:
        if m.num_heads % t or m.num_kv_heads % t or any(w % t for w in widths):
            bad("parallel_variants.tp", f"tp={t} must divide num_heads={m.num_heads}, "
                                        f"num_kv_heads={m.num_kv_heads} and every MLP width")
    for e in pv.ep:
        if m.num_experts % e:
            bad("parallel_variants.ep", f"ep={e} does not divide num_experts={m.num_experts}")
    for t in pv.tp:
        for c in pv.cp:
            split = c * (t if True in pv.sp and t > 1 else 1)
            if m.seq_len % split:
                how = f"cp={c} x tp={t} under sequence parallelism" if split != c else f"cp={c}"
                bad("seq_len", f"{m.seq_len} is not a multiple of {split} ({how}, a variant of "
                               f"key 'parallel_variants' splits the sequence so)")


def check_microbatch(m: ModelSpec, mbs: int, where: str = "") -> None:
    """mbs within the tokens one micro-batch may hold (MAX_MICROBATCH_TOKENS)."""
    if isinstance(mbs, bool) or not isinstance(mbs, int) or mbs < 1:
        raise SpecError(f"{where or m.source_file or m.name}: mbs={short(mbs)}: expected a "
                        f"positive integer")
    if mbs * m.seq_len > MAX_MICROBATCH_TOKENS:
        raise SpecError(f"{where or m.source_file or m.name}: mbs x seq_len = {mbs} x "
                        f"{m.seq_len} tokens per micro-batch exceeds {MAX_MICROBATCH_TOKENS} "
                        f"(nest.spec.catalog.MAX_MICROBATCH_TOKENS)")


def load_model(name_or_path: str | os.PathLike, seq_len: int | None = None) -> ModelSpec:
    """A catalog name, a model YAML, or a Hugging Face config.json (nest.graph.hf_spec: Llama,
    Mistral, Mixtral, Qwen2/2.5/3, Qwen2-MoE/Qwen3-MoE, Gemma-2, Phi-3, DeepSeek-V2/V3, GPT-2,
    BERT). `seq_len` replaces the file's sequence length (a figure's `seq_len`, `--seq-len`); a
    config.json has none of its own and warns when it is not given."""
    if str(name_or_path).endswith(".json"):
        return model_spec_from_hf_config(name_or_path, seq_len=seq_len)
    folder = Path(name_or_path)
    if folder.is_dir() and not (config_dir() / "models" / f"{folder}.yaml").exists():
        # a Hugging Face model folder (a download, a hub-cache snapshot): its config.json
        if not (folder / "config.json").is_file():
            raise SpecError(f"{folder}: is a folder without a config.json (expected a catalog "
                            f"name, a model YAML, a Hugging Face config.json or its folder)")
        return model_spec_from_hf_config(folder / "config.json", seq_len=seq_len)
    path = _resolve("models", name_or_path)
    d = read_yaml(path)
    if isinstance(d, dict) and "hf_config" in d:  # a catalog entry that is a config.json
        return _model_from_hf_entry(d, path, seq_len)
    if seq_len is not None:
        d = {**d, "seq_len": seq_len}
    return model_from_dict(d, str(path))


def _model_from_hf_entry(d: dict, path: Path, seq_len: int | None) -> ModelSpec:
    """A model YAML that names a Hugging Face config.json (`hf_config`, relative to the YAML's
    folder and inside it) and gives what a config.json lacks: the catalog name, the training
    sequence length and, optionally, the parallel variants (else derived, nest.graph.hf_spec)."""
    where = str(path)
    validate(d, "model_hf", where)
    root = path.parent.resolve()
    config = (root / d["hf_config"]).resolve()
    if root not in config.parents or not config.is_file():
        raise SpecError(f"{where}: key 'hf_config': {d['hf_config']!r}: expected a config.json "
                        f"inside {root}")
    return model_spec_from_hf_config(config, name=d["name"],
                                     seq_len=seq_len if seq_len is not None else d["seq_len"],
                                     parallel_variants=d.get("parallel_variants"))


# --------------------------------------------------------------------------------------------
# Model from a Hugging Face config.json: nest.graph.hf_spec (imported lazily; re-exported here)
# --------------------------------------------------------------------------------------------


def load_hf_config(path: str | os.PathLike) -> dict:
    return load_json(path, "Hugging Face config.json")


def model_spec_from_hf_config(config: dict | str | os.PathLike, **kw) -> ModelSpec:
    """nest.graph.hf_spec.model_spec_from_hf_config (see there)."""
    from nest.graph.hf_spec import model_spec_from_hf_config as from_hf

    try:
        return from_hf(config, **kw)
    except KeyError as e:  # a key the config's family needs (e.g. a llama's intermediate_size)
        where = "<config dict>" if isinstance(config, dict) else str(config)
        raise SpecError(f"{where}: key {e}: missing; this model_type needs it") from None


# --------------------------------------------------------------------------------------------
# Hardware
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    peak_flops_per_s: float
    hbm_bytes: float
    hbm_bytes_per_s: float
    matmul_efficiency: float = 0.75
    matmul_half_efficiency_flops: float = 0.0
    attention_efficiency: float = 0.5
    memory_efficiency: float = 0.85
    kernel_overhead_s: float = 0.0
    # the framework's reserve (YAML framework_reserve_GB): CUDA context, NCCL / cuBLAS buffers
    memory_overhead_bytes: float = 0.0
    # allocator slack as a fraction of what is allocated (YAML allocator_fragmentation)
    memory_fragmentation: float = 0.0
    source: str = ""
    profile_dir: str | None = None  # measured operator profiles (nest.costs.profiled), if any
    peak_fp8_flops_per_s: float = 0.0  # dense FP8 tensor-core peak; 0: no FP8 (nest.spec.precision)
    hbm_source: str = ""  # where the usable HBM bytes come from (device query or datasheet)
    # how training code of this hardware's generation runs attention by default (nest.graph.
    # attention): "flash" (fused kernel) | "unfused" (scores materialised, Megatron-LM 2021-22)
    attention_implementation: str = "flash"
    # eager PyTorch's host time per operator call, forward and backward (nest.profiling.host):
    # the floor under a host-bound layer's time (nest.costs.table.layer_times); 0: none
    host_fwd_s_per_op: float = 0.0
    host_bwd_s_per_op: float = 0.0
    # share of the HBM bandwidth the memory-bound operators (norms, softmax, dropout, residual
    # adds, activations; nest.costs.roofline) reach; None: memory_efficiency
    elementwise_efficiency: float | None = None
    # "serial": a GEMM's epilogue (here the FP32 main-gradient read-modify-write of a wgrad,
    # nest.costs.table.main_grad_accumulation_s) runs after each tile's main loop (Ampere and
    # earlier); "overlapped": Hopper's warp-specialized persistent kernels run one tile's
    # epilogue under another's main loop, so it hides under a compute-bound GEMM
    gemm_epilogue: str = "overlapped"
    # NVLink SHARP (NVLS: reductions in the NVLink switch; NVSwitch gen 3 on HGX H100 / H200, the
    # NVLink switch of B200 / GB200): NCCL's NVLS all-reduce bus bandwidth over a whole NVLink
    # domain per unit of the domain's per-direction link bandwidth (nest.network.nvls); 0: the
    # switch has none (A100's NVSwitch gen 2, V100, TPU)
    nvls_efficiency: float = 0.0
    # NCCL's cap on an NVLS-Tree channel (one per NIC of a node), bytes/s, on two nodes and on
    # more (tuning.cc perChMaxNVLSTreeBws); 0: no cap
    nvls_tree_cap_bytes_per_s: tuple[float, float] = (0.0, 0.0)
    # streaming multiprocessors (datasheet): a GEMM launched with an SM margin for a
    # communication kernel runs on sm_count - margin of them (nest.costs.groups.tp_overlapped);
    # 0: unknown, no margin priced
    sm_count: int = 0


def _profile_dir(name: str, where: str) -> str:
    """A hardware file's `profile:` -> the folder: profiles/<name> beside config_dir(), else
    beside the package (the repository's profiles/), else a path relative to the YAML file."""
    for root in (config_dir().parent / "profiles", Path(__file__).resolve().parent.parent.parent
                 / "profiles", Path(where).parent):
        if (root / name / "matmul.csv").exists():
            return str((root / name).resolve())
    raise SpecError(f"{where}: key 'profile': no measured profile '{name}' (looked for "
                    f"profiles/{name}/matmul.csv beside {config_dir()})")


def _own_profile_dir(d: dict, where: str) -> str | None:
    """The measured profile of this card, or None (the roofline prices it). A profile measured
    on another card is refused, not borrowed: its meta.json `hardware` (else its folder name)
    must be this file's `name`."""
    if not d.get("profile"):
        return None
    path = _profile_dir(d["profile"], where)
    meta = Path(path) / "meta.json"
    try:  # a shared profile folder is untrusted: read through the guarded loader
        measured_on = load_json(meta, "profile meta.json").get("hardware") if meta.is_file() \
            else None
    except (SpecError, AttributeError):
        measured_on = None
    measured_on = measured_on or Path(path).name
    if measured_on != d["name"]:
        raise SpecError(f"{where}: key 'profile': '{d['profile']}' was measured on "
                        f"'{measured_on}', not on '{d['name']}'; a card never borrows another "
                        f"card's operator profiles: remove 'profile' (the roofline prices it) or "
                        f"measure this card (nest profile)")
    return path


def hbm_bytes_of(d: dict, where: str) -> float:
    """Usable HBM from exactly one of hbm_bytes (a device query: torch.cuda's total_memory),
    hbm_GiB (nvidia-smi's MiB / 1024, or a datasheet's binary GB) or hbm_GB (decimal)."""
    given = [k for k in ("hbm_bytes", "hbm_GiB", "hbm_GB") if k in d]
    if len(given) != 1:
        raise SpecError(f"{where}: key 'hbm_bytes': give exactly one of hbm_bytes, hbm_GiB, "
                        f"hbm_GB (got {given or 'none'})")
    k = given[0]
    return float(d[k]) * {"hbm_bytes": 1.0, "hbm_GiB": GiB, "hbm_GB": GB}[k]


def hardware_from_dict(d: dict, where: str) -> HardwareSpec:
    validate(d, "hardware", where)
    return HardwareSpec(
        name=d["name"],
        peak_flops_per_s=d["peak_flops_TFLOPs"] * TFLOP,
        hbm_bytes=hbm_bytes_of(d, where),
        hbm_bytes_per_s=d["hbm_bandwidth_GBps"] * GB,
        matmul_efficiency=d.get("matmul_efficiency", 0.75),
        matmul_half_efficiency_flops=d.get("matmul_half_efficiency_GFLOP", 0.0) * 1e9,
        attention_efficiency=d.get("attention_efficiency", 0.5),
        memory_efficiency=d.get("memory_efficiency", 0.85),
        kernel_overhead_s=d.get("kernel_overhead_us", 0.0) * US,
        memory_overhead_bytes=d.get("framework_reserve_GB", 0.0) * GB,
        memory_fragmentation=d.get("allocator_fragmentation", 0.0),
        source=d["source"],
        profile_dir=_own_profile_dir(d, where),
        peak_fp8_flops_per_s=d.get("peak_fp8_TFLOPs", 0.0) * TFLOP,
        hbm_source=d.get("hbm_source", ""),
        attention_implementation=d.get("attention_implementation", "flash"),
        host_fwd_s_per_op=d.get("host_fwd_us_per_op", 0.0) * US,
        elementwise_efficiency=d.get("elementwise_efficiency"),
        gemm_epilogue=d.get("gemm_epilogue", "overlapped"),
        host_bwd_s_per_op=d.get("host_bwd_us_per_op", 0.0) * US,
        nvls_efficiency=d.get("nvls_efficiency", 0.0),
        nvls_tree_cap_bytes_per_s=tuple(x * GB for x in d.get("nvls_tree_cap_GBps", (0.0, 0.0))),
        sm_count=d.get("sm_count", 0),
    )


def load_hardware(name_or_path: str | os.PathLike) -> HardwareSpec:
    path = _resolve("hardware", name_or_path)
    return hardware_from_dict(read_yaml(path), str(path))


# --------------------------------------------------------------------------------------------
# Cluster
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NetworkLevel:
    name: str
    devices_per_group: int  # devices under one switch of this level (cumulative)
    bytes_per_s: float  # per device, per direction
    latency_s: float
    oversubscription: float = 1.0
    # per device, what a ring collective over one whole group of this level reaches when it
    # uses more links than the level's bandwidth counts (a torus block's rings along every
    # dimension: nest.network.topology.torus_levels); 0: none (bytes_per_s prices it)
    ring_bytes_per_s: float = 0.0
    # per device, NCCL's NVLS all-reduce bus bandwidth over one whole group of this level (the
    # first level, an NVLink switch domain of hardware with NVLink SHARP: nest.network.nvls);
    # 0: none
    nvls_bytes_per_s: float = 0.0
    # the share of the line rate that NCCL reaches, which bytes_per_s already holds (the cluster
    # file's `efficiency`): a kernel with its own measured rate prices against the line
    # (nest.network.hybrid_ep)
    efficiency: float = 1.0

    @property
    def line_bytes_per_s(self) -> float:
        """Per device, per direction: the link's nominal rate (bandwidth_GBps)."""
        return self.bytes_per_s / self.efficiency


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    hardware: HardwareSpec
    levels: tuple[NetworkLevel, ...]
    num_devices: int
    sizes: tuple[int, ...] = ()
    source: str = ""
    # how the cluster file gave its network: "levels" or a nest.network.fabric kind
    network: str = "levels"
    # where the reduction of that network to levels approximates it (nest.network.fabric)
    notes: tuple[str, ...] = ()
    # files the network section reads besides the cluster file (a graph file), as resolved paths
    network_files: tuple[str, ...] = ()
    # the levels' bandwidths / comm_scale and latencies x comm_scale relative to the cluster as
    # described (the training settings' cost_scale.communication; `with_comm_scale`)
    comm_scale: float = 1.0
    # a stated scale-out band (a rail_optimized network's rail_efficiency_low / rail_efficiency):
    # at the band's low end every level above the first runs at this fraction of its bandwidth;
    # priced at the nominal (1: no band). `at_band_low_end`
    scale_out_low: float = 1.0
    # accelerators per host (server / compute tray): what a launcher runs one agent on, which
    # need not be the first network level (a GB200 NVL72 rack: trays of 4 GPUs, NVLink domain
    # of 72); 0: the first level's group size (`node_size`)
    devices_per_node: int = 0
    # the network description's name of each device id where the reduction to levels numbers
    # devices otherwise than the file lists them (a graph file's node ids, a torus's 'x,y,z'
    # coordinates; nest.network.fabric.network_levels): `nest export` writes it in rank_map.csv.
    # Not part of equality or the hash (the cluster keys the collectives' caches; names price
    # nothing, and hashing thousands of them per call would slow every lookup)
    device_names: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @property
    def node_size(self) -> int:
        """Devices per host: the cluster file's `devices_per_node` (or its rail-optimised /
        multi-plane network's), else the first network level's group size."""
        return self.devices_per_node or self.levels[0].devices_per_group

    def with_comm_scale(self, k: float) -> "ClusterSpec":
        """This cluster with every network time scaled by k relative to the cluster as described
        (per-level bandwidth / k, latency x k, so every alpha-beta line of
        nest.network.collectives scales by k); idempotent, the levels always derived from the
        described ones."""
        if k == self.comm_scale:
            return self
        r = k / self.comm_scale
        levels = tuple(replace(lv, bytes_per_s=lv.bytes_per_s / r, latency_s=lv.latency_s * r,
                               ring_bytes_per_s=lv.ring_bytes_per_s / r,
                               nvls_bytes_per_s=lv.nvls_bytes_per_s / r)
                       for lv in self.levels)
        return replace(self, levels=levels, comm_scale=k)

    def at_band_low_end(self) -> "ClusterSpec":
        """This cluster at the low end of its stated scale-out band (named '<name>_low'): every
        level above the first at `scale_out_low` of its bandwidth, as if the cluster file gave
        that efficiency; itself if it states no band."""
        f = self.scale_out_low
        if f == 1.0:
            return self
        levels = (self.levels[0], *(replace(lv, bytes_per_s=lv.bytes_per_s * f,
                                            ring_bytes_per_s=lv.ring_bytes_per_s * f)
                                    for lv in self.levels[1:]))
        return replace(self, name=f"{self.name}_low", levels=levels, scale_out_low=1.0)

    @property
    def max_devices(self) -> int:
        return self.levels[-1].devices_per_group

    def level_of(self, a: int, b: int) -> int:
        """Index of the lowest network level whose switch joins devices a and b (-1 if a == b)."""
        if a == b:
            return -1
        for i, lv in enumerate(self.levels):
            if a // lv.devices_per_group == b // lv.devices_per_group:
                return i
        raise AssertionError(f"devices {a} and {b} share no level in {self.name}")


def _beside(name: str, where: str) -> str:
    """A cluster file's `hardware` path read against the cluster file's folder, as its graph
    file is (nest.network.fabric) and a plan's model and cluster paths are (nest.problem.
    plan_spec.resolve_relative): a cluster and its hardware file shipped side by side load from
    any working folder. A name, an absolute path or a path naming no file there stay as given."""
    folder = Path(where).parent if Path(where).is_file() else None
    if folder is None or not (name.endswith((".yaml", ".yml")) or os.sep in name):
        return name
    here = folder / name
    return str(here) if not Path(name).is_absolute() and here.is_file() else name


def cluster_from_dict(d: dict, where: str, num_devices: int | None) -> ClusterSpec:
    network, notes, files, per_node, band, names = "levels", (), (), 0, 1.0, ()
    if isinstance(d, dict) and "network" in d:  # a named builder or a graph file
        from nest.network.fabric import expand_network

        net = d["network"]
        network = net.get("kind", "?") if isinstance(net, dict) else "?"
        if network in ("rail_optimized", "multi_plane"):  # the builder's own node
            per_node = net.get("devices_per_node", 0)
        d, notes, files, names = expand_network(d, where)
        if network == "rail_optimized" and net.get("rail_efficiency_low") is not None:
            band = net["rail_efficiency_low"] / net.get("rail_efficiency", 1.0)
    validate(d, "cluster", where)
    per_node = d.get("devices_per_node", per_node)
    levels = tuple(
        NetworkLevel(
            name=lv["name"],
            devices_per_group=lv["devices_per_group"],
            # what collectives achieve: link bandwidth x measured NCCL efficiency (default 1)
            bytes_per_s=lv["bandwidth_GBps"] * GB * lv.get("efficiency", 1.0),
            latency_s=lv["latency_us"] * US,
            oversubscription=lv.get("oversubscription", 1.0),
            ring_bytes_per_s=lv.get("ring_bandwidth_GBps", 0.0) * GB * lv.get("efficiency", 1.0),
            efficiency=lv.get("efficiency", 1.0),
        )
        for lv in d["levels"]
    )
    for i in range(1, len(levels)):
        lo, hi = levels[i - 1].devices_per_group, levels[i].devices_per_group
        if hi <= lo or hi % lo:
            raise SpecError(f"{where}: key 'levels.{i}.devices_per_group': {hi} must be a larger "
                            f"multiple of the level below ({lo})")
        seen = [lv.name for lv in levels[:i]]
        if levels[i].name in seen:  # messages, tables and pictures name levels
            raise SpecError(f"{where}: key 'levels.{i}.name': {levels[i].name!r} repeats "
                            f"levels.{seen.index(levels[i].name)}.name; expected a name of its own")
    sizes = tuple(d.get("sizes", ()))
    n = num_devices if num_devices is not None else (sizes[-1] if sizes else levels[-1].devices_per_group)
    top = levels[-1].devices_per_group
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise SpecError(f"{where}: num_devices={n!r}: expected a positive number of devices")
    if n > top:
        raise SpecError(f"{where}: num_devices={n} does not fit: the cluster's top level "
                        f"'{levels[-1].name}' holds at most {top} devices")
    if n > MAX_DEVICES:
        raise SpecError(f"{where}: num_devices={n} exceeds the harness's limit of {MAX_DEVICES} "
                        f"devices (placements and collective groups are built per device; "
                        f"nest.spec.catalog.MAX_DEVICES)")
    inner = levels[0].devices_per_group
    if n > inner and n % inner:
        raise SpecError(f"{where}: num_devices={n} must be a multiple of {inner} (devices per "
                        f"'{levels[0].name}') when it spans more than one")
    if per_node and (top % per_node or (n > per_node and n % per_node)):
        raise SpecError(f"{where}: key 'devices_per_node': {per_node} must divide the cluster's "
                        f"{top} devices and num_devices={n} when that spans more than one node")
    for i, k in enumerate(sizes):  # the device counts a figure's `num_devices: sizes` plans
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= top or (
                k > inner and k % inner) or (per_node and k > per_node and k % per_node):
            raise SpecError(f"{where}: key 'sizes.{i}': {k!r} is not a device count the cluster "
                            f"holds (from 1 to {top}; above {inner}, a multiple of {inner}, the "
                            f"devices per '{levels[0].name}'"
                            + (f", and of devices_per_node {per_node}" if per_node else "") + ")")
    try:
        hardware = load_hardware(_beside(d["hardware"], where))
    except SpecError as e:
        raise SpecError(f"{where}: key 'hardware': {e}") from None
    if hardware.nvls_efficiency > 0 and d["levels"][0].get("nvlink_switch", True):
        # the first level is the NVLink switch domain (a torus's or a stated non-switch is not)
        levels = (replace(levels[0], nvls_bytes_per_s=d["levels"][0]["bandwidth_GBps"] * GB
                          * hardware.nvls_efficiency), *levels[1:])
    return ClusterSpec(
        name=d["name"],
        hardware=hardware,
        levels=levels,
        num_devices=n,
        sizes=sizes,
        source=d["source"],
        network=network,
        notes=notes,
        network_files=files,
        scale_out_low=float(band),
        devices_per_node=int(per_node),
        device_names=names,
    )


def load_cluster(name_or_path: str | os.PathLike, num_devices: int | None = None) -> ClusterSpec:
    path = _resolve("clusters", name_or_path)
    return cluster_from_dict(read_yaml(path), str(path), num_devices)
