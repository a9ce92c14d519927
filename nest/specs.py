"""Catalog YAML (model / hardware / cluster) -> frozen dataclasses in SI units, validated;
a Hugging Face config.json -> ModelSpec as well.

Human units (GB/s, GB, us, TFLOP/s) appear only in the hand-written YAML files and are converted
here, once. Every other module works in seconds, bytes, FLOPs and bytes per second.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import jsonschema
import yaml

from nest.atomic_io import write_text_atomic  # noqa: F401 - the one atomic writer, re-exported
from nest.errors import SpecError

GB = 1e9
GiB = 2**30
TFLOP = 1e12
US = 1e-6
# size guard: the most devices a problem may use (64x the paper's largest, 1024; a plan's
# device ids, placements and collective groups are built per device)
MAX_DEVICES = 65536

SCHEMA_DIR = Path(__file__).parent / "schemas"


def config_dir() -> Path:
    """The catalog root: $NEST_CONFIG_DIR, else the repository's config/ next to the package."""
    env = os.environ.get("NEST_CONFIG_DIR")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "config"


def shown(path) -> str:
    """A path as messages and results show it: relative to the working directory when below it
    (so a result does not depend on where the repository was cloned)."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


@cache
def load_schema(kind: str) -> dict:
    return json.loads((SCHEMA_DIR / f"{kind}.json").read_text())


def _error_path(err: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in err.absolute_path) or "<top level>"


def validate(data: object, kind: str, where: str) -> None:
    """Validate `data` against schema `kind`; raise SpecError naming the file and key."""
    validator = jsonschema.Draft202012Validator(load_schema(kind))
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        raise SpecError(f"{where}: key '{_error_path(e)}': {e.message}{more}")


class _Loader(yaml.SafeLoader):
    """safe_load with two fixes: a key given twice in one mapping is an error (PyYAML silently
    keeps the last), and `5e1` / `1e9` are numbers as in YAML 1.2 (YAML 1.1 needs `5.0e+1`)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for k, _ in node.value:
            key = self.construct_object(k, deep=True)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, f"unhashable key {key!r}", k.start_mark) from None
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key '{key}' (first at line {seen[key] + 1})",
                    k.start_mark)
            seen[key] = k.start_mark.line
        return super().construct_mapping(node, deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def read_text(path, what: str = "file") -> str:
    """A text file's contents; a missing file, a folder, an unreadable or binary file is a
    SpecError naming the path."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise SpecError(f"{path}: is a folder, expected a {what}") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not a text file (UTF-8), expected a {what}") from None
    except OSError as e:
        raise SpecError(f"{path}: cannot read: {e.strerror or e}") from None


def parse_yaml(text: str, where: str):
    """YAML text -> data (`_Loader`); a syntax error or duplicate key is one SpecError line with
    the file, line and column."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = " ".join(x for x in (e.context, e.problem) if x)
        raise SpecError(f"{where}: malformed YAML{at}: {what}") from None
    except yaml.YAMLError as e:
        raise SpecError(f"{where}: malformed YAML: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise SpecError(f"{where}: malformed YAML: nested too deeply") from None


def read_yaml(path: Path) -> dict:
    data = parse_yaml(read_text(path, "YAML file"), str(path))
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


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
    shared_ffn_hidden_size: int = 0  # always-active shared expert(s) of an MoE layer, in total
    shared_expert_gate: bool = False  # sigmoid gate Linear(h, 1) on the shared expert (Qwen2-MoE)
    num_dense_layers: int = 0  # the first blocks of an MoE model with a dense MLP (DeepSeek)
    dense_ffn_hidden_size: int = 0  # their MLP width
    q_lora_rank: int = 0  # multi-head latent attention (DeepSeek-V2/V3): Q down-projection rank
    kv_lora_rank: int = 0  # MLA: compressed K/V rank (> 0 turns MLA on)
    qk_rope_head_dim: int = 0  # MLA: rotary part of each Q/K head (head_size = nope + rope)
    v_head_dim: int = 0  # MLA: V width per head

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
    spec = ModelSpec(
        **d,
        parallel_variants=ParallelVariants(**{k: tuple(v) for k, v in pv.items()}),
        source_file=where,
    )
    if spec.hidden_size % spec.num_heads and not spec.head_size:
        raise SpecError(f"{where}: key 'hidden_size': {spec.hidden_size} is not a multiple of "
                        f"num_heads={spec.num_heads}")
    if spec.num_heads % spec.num_kv_heads:
        raise SpecError(f"{where}: key 'num_kv_heads': {spec.num_kv_heads} must divide "
                        f"num_heads={spec.num_heads}")
    if spec.top_k > spec.num_experts:
        raise SpecError(f"{where}: key 'top_k': {spec.top_k} exceeds num_experts={spec.num_experts}")
    for t in spec.parallel_variants.tp:
        if spec.num_kv_heads % t and spec.num_heads % t:
            raise SpecError(f"{where}: key 'parallel_variants.tp': t={t} divides neither "
                            f"num_heads nor num_kv_heads")
    for e in spec.parallel_variants.ep:
        if spec.num_experts % e:
            raise SpecError(f"{where}: key 'parallel_variants.ep': ep={e} does not divide "
                            f"num_experts={spec.num_experts}")
    return spec


def load_model(name_or_path: str | os.PathLike, seq_len: int | None = None) -> ModelSpec:
    """A catalog name, a model YAML, or a Hugging Face config.json (nest.graph.hf_spec: Llama,
    Mistral, Mixtral, Qwen2/2.5/3, Qwen2-MoE/Qwen3-MoE, Gemma-2, Phi-3, DeepSeek-V2/V3, GPT-2,
    BERT). `seq_len` replaces the file's sequence length (a figure's `seq_len`, `--seq-len`); a
    config.json has none of its own and warns when it is not given."""
    if str(name_or_path).endswith(".json"):
        return model_spec_from_hf_config(name_or_path, seq_len=seq_len)
    path = _resolve("models", name_or_path)
    d = read_yaml(path)
    if seq_len is not None:
        d = {**d, "seq_len": seq_len}
    return model_from_dict(d, str(path))


# --------------------------------------------------------------------------------------------
# Model from a Hugging Face config.json: nest.graph.hf_spec (imported lazily; re-exported here)
# --------------------------------------------------------------------------------------------


def load_hf_config(path: str | os.PathLike) -> dict:
    try:
        cfg = json.loads(read_text(path, "Hugging Face config.json"))
    except json.JSONDecodeError as e:
        raise SpecError(f"{path}: malformed JSON: {e}") from None
    except RecursionError:
        raise SpecError(f"{path}: malformed JSON: nested too deeply") from None
    if not isinstance(cfg, dict):
        raise SpecError(f"{path}: expected an object at the top level, got {type(cfg).__name__}")
    return cfg


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
    peak_fp8_flops_per_s: float = 0.0  # dense FP8 tensor-core peak; 0: no FP8 (nest.precision)
    hbm_source: str = ""  # where the usable HBM bytes come from (device query or datasheet)
    # how training code of this hardware's generation runs attention by default (nest.graph.
    # attention): "flash" (fused kernel) | "unfused" (scores materialised, Megatron-LM 2021-22)
    attention_implementation: str = "flash"
    # eager PyTorch's host time per operator call, forward and backward (nest.profiling.host):
    # the floor under a host-bound layer's time (nest.costs.table.layer_times); 0: none
    host_fwd_s_per_op: float = 0.0
    host_bwd_s_per_op: float = 0.0


def _profile_dir(name: str, where: str) -> str:
    """A hardware file's `profile:` -> the folder: profiles/<name> beside config_dir(), else
    beside the package (the repository's profiles/), else a path relative to the YAML file."""
    for root in (config_dir().parent / "profiles", Path(__file__).resolve().parent.parent
                 / "profiles", Path(where).parent):
        if (root / name / "matmul.csv").exists():
            return str((root / name).resolve())
    raise SpecError(f"{where}: key 'profile': no measured profile '{name}' (looked for "
                    f"profiles/{name}/matmul.csv beside {config_dir()})")


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
        profile_dir=_profile_dir(d["profile"], where) if d.get("profile") else None,
        peak_fp8_flops_per_s=d.get("peak_fp8_TFLOPs", 0.0) * TFLOP,
        hbm_source=d.get("hbm_source", ""),
        attention_implementation=d.get("attention_implementation", "flash"),
        host_fwd_s_per_op=d.get("host_fwd_us_per_op", 0.0) * US,
        host_bwd_s_per_op=d.get("host_bwd_us_per_op", 0.0) * US,
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


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    hardware: HardwareSpec
    levels: tuple[NetworkLevel, ...]
    num_devices: int
    sizes: tuple[int, ...] = ()
    source: str = ""

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


def cluster_from_dict(d: dict, where: str, num_devices: int | None) -> ClusterSpec:
    validate(d, "cluster", where)
    levels = tuple(
        NetworkLevel(
            name=lv["name"],
            devices_per_group=lv["devices_per_group"],
            # what collectives achieve: link bandwidth x measured NCCL efficiency (default 1)
            bytes_per_s=lv["bandwidth_GBps"] * GB * lv.get("efficiency", 1.0),
            latency_s=lv["latency_us"] * US,
            oversubscription=lv.get("oversubscription", 1.0),
        )
        for lv in d["levels"]
    )
    for i in range(1, len(levels)):
        lo, hi = levels[i - 1].devices_per_group, levels[i].devices_per_group
        if hi <= lo or hi % lo:
            raise SpecError(f"{where}: key 'levels.{i}.devices_per_group': {hi} must be a larger "
                            f"multiple of the level below ({lo})")
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
                        f"nest.specs.MAX_DEVICES)")
    inner = levels[0].devices_per_group
    if n > inner and n % inner:
        raise SpecError(f"{where}: num_devices={n} must be a multiple of {inner} (devices per "
                        f"'{levels[0].name}') when it spans more than one")
    try:
        hardware = load_hardware(d["hardware"])
    except SpecError as e:
        raise SpecError(f"{where}: key 'hardware': {e}") from None
    return ClusterSpec(
        name=d["name"],
        hardware=hardware,
        levels=levels,
        num_devices=n,
        sizes=sizes,
        source=d["source"],
    )


def load_cluster(name_or_path: str | os.PathLike, num_devices: int | None = None) -> ClusterSpec:
    path = _resolve("clusters", name_or_path)
    return cluster_from_dict(read_yaml(path), str(path), num_devices)
