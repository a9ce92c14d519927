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

from nest.errors import SpecError

GB = 1e9
TFLOP = 1e12
US = 1e-6

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


def read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise SpecError(f"{path}: file not found") from None
    except yaml.YAMLError as e:
        raise SpecError(f"{path}: malformed YAML: {e}") from None
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
        raise SpecError(f"unknown {kind_dir[:-1]} '{s}': no file {path}; known: {known}")
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
    parallel_variants: ParallelVariants = field(default_factory=ParallelVariants)
    source_file: str = ""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

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
    spec = ModelSpec(
        **d,
        parallel_variants=ParallelVariants(**{k: tuple(v) for k, v in pv.items()}),
        source_file=where,
    )
    if spec.hidden_size % spec.num_heads:
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


def load_model(name_or_path: str | os.PathLike) -> ModelSpec:
    """A catalog name, a model YAML, or a Hugging Face config.json (Llama, Mistral, Mixtral,
    GPT-2, BERT families; model_spec_from_hf_config below)."""
    if str(name_or_path).endswith(".json"):
        return model_spec_from_hf_config(name_or_path)
    path = _resolve("models", name_or_path)
    return model_from_dict(read_yaml(path), str(path))


# --------------------------------------------------------------------------------------------
# Model from a Hugging Face config.json
# --------------------------------------------------------------------------------------------

# Supported `model_type`s: llama, mistral (Llama family), mixtral (MoE), gpt2 (GPT family), bert.
# A config that our compact modules cannot represent exactly (biases in a Llama, a head_dim other
# than hidden/heads, another activation) is refused with the file and key, never approximated.
# nest.graph.hf_config exports the transformers module itself (torch.export) as a cross-check.

_HF_FAMILY = {"llama": "llama", "mistral": "llama", "mixtral": "mixtral", "gpt2": "gpt",
              "bert": "bert"}


def load_hf_config(path: str | os.PathLike) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SpecError(f"{path}: file not found") from None
    except json.JSONDecodeError as e:
        raise SpecError(f"{path}: malformed JSON: {e}") from None


def _hf_name(cfg: dict, where: str) -> str:
    raw = cfg.get("_name_or_path") or Path(where).stem
    return re.sub(r"[^a-z0-9_]+", "_", str(raw).lower().rsplit("/", 1)[-1]).strip("_") or "hf_model"


def _hf_require(cfg: dict, key: str, ok, where: str, what: str) -> None:
    if key in cfg and cfg[key] is not None and not ok(cfg[key]):
        raise SpecError(f"{where}: key '{key}': {cfg[key]!r} is not supported ({what})")


def model_spec_from_hf_config(config: dict | str | os.PathLike, *, name: str | None = None,
                              seq_len: int | None = None,
                              parallel_variants: dict | None = None) -> ModelSpec:
    """A HF config (dict or path to config.json) as our ModelSpec (validated like a catalog YAML).

    seq_len defaults to max_position_embeddings (n_positions for gpt2)."""
    where = "<config dict>" if isinstance(config, dict) else str(config)
    cfg = config if isinstance(config, dict) else load_hf_config(config)
    mtype = cfg.get("model_type")
    if mtype not in _HF_FAMILY:
        raise SpecError(f"{where}: key 'model_type': {mtype!r} is not supported "
                        f"(known: {', '.join(sorted(_HF_FAMILY))})")
    family = _HF_FAMILY[mtype]
    if family == "gpt":
        h = cfg["n_embd"]
        d = dict(num_layers=cfg["n_layer"], hidden_size=h, num_heads=cfg["n_head"],
                 ffn_hidden_size=cfg.get("n_inner") or 4 * h, ffn_type="gelu",
                 seq_len=seq_len or cfg["n_positions"],
                 tied_embeddings=cfg.get("tie_word_embeddings", True))
    else:
        d = dict(num_layers=cfg["num_hidden_layers"], hidden_size=cfg["hidden_size"],
                 num_heads=cfg["num_attention_heads"],
                 num_kv_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
                 ffn_hidden_size=cfg["intermediate_size"],
                 ffn_type="gelu" if family == "bert" else "swiglu",
                 seq_len=seq_len or cfg["max_position_embeddings"],
                 tied_embeddings=cfg.get("tie_word_embeddings", family == "bert"))
    if family in ("llama", "mixtral"):
        _hf_require(cfg, "attention_bias", lambda v: not v, where, "our Llama has no biases")
        _hf_require(cfg, "mlp_bias", lambda v: not v, where, "our Llama has no biases")
        _hf_require(cfg, "hidden_act", lambda v: v == "silu", where, "SwiGLU needs silu")
        _hf_require(cfg, "head_dim", lambda v: v == d["hidden_size"] // d["num_heads"], where,
                 "head_dim must be hidden_size / num_attention_heads")
    if family == "bert":
        _hf_require(cfg, "type_vocab_size", lambda v: v == 2, where, "BERT with 2 token types")
        _hf_require(cfg, "hidden_act", lambda v: str(v).startswith("gelu"), where, "GELU MLP")
    if family == "mixtral":
        d.update(num_experts=cfg["num_local_experts"], top_k=cfg["num_experts_per_tok"])
    d.update(name=name or _hf_name(cfg, where), family=family, vocab_size=cfg["vocab_size"],
             causal=family != "bert")
    if parallel_variants:
        d["parallel_variants"] = parallel_variants
    return model_from_dict(d, where)


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
    memory_overhead_bytes: float = 0.0  # framework: runtime context, comm buffers, workspace
    memory_fragmentation: float = 0.0  # allocator slack as a fraction of what is allocated
    source: str = ""
    profile_dir: str | None = None  # measured operator profiles (nest.costs.profiled), if any


def _profile_dir(name: str, where: str) -> str:
    """A hardware file's `profile:` -> the folder: profiles/<name> beside config_dir(), else
    beside the package (the repository's profiles/), else a path relative to the YAML file."""
    for root in (config_dir().parent / "profiles", Path(__file__).resolve().parent.parent
                 / "profiles", Path(where).parent):
        if (root / name / "matmul.csv").exists():
            return str((root / name).resolve())
    raise SpecError(f"{where}: key 'profile': no measured profile '{name}' (looked for "
                    f"profiles/{name}/matmul.csv beside {config_dir()})")


def hardware_from_dict(d: dict, where: str) -> HardwareSpec:
    validate(d, "hardware", where)
    return HardwareSpec(
        name=d["name"],
        peak_flops_per_s=d["peak_flops_TFLOPs"] * TFLOP,
        hbm_bytes=d["hbm_GB"] * GB,
        hbm_bytes_per_s=d["hbm_bandwidth_GBps"] * GB,
        matmul_efficiency=d.get("matmul_efficiency", 0.75),
        matmul_half_efficiency_flops=d.get("matmul_half_efficiency_GFLOP", 0.0) * 1e9,
        attention_efficiency=d.get("attention_efficiency", 0.5),
        memory_efficiency=d.get("memory_efficiency", 0.85),
        kernel_overhead_s=d.get("kernel_overhead_us", 0.0) * US,
        memory_overhead_bytes=d.get("memory_overhead_GB", 0.0) * GB,
        memory_fragmentation=d.get("memory_fragmentation", 0.0),
        source=d["source"],
        profile_dir=_profile_dir(d["profile"], where) if d.get("profile") else None,
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
    if n < 1 or n > top:
        raise SpecError(f"{where}: num_devices={n} does not fit: the cluster's top level "
                        f"'{levels[-1].name}' holds at most {top} devices")
    inner = levels[0].devices_per_group
    if n > inner and n % inner:
        raise SpecError(f"{where}: num_devices={n} must be a multiple of {inner} (devices per "
                        f"'{levels[0].name}') when it spans more than one")
    return ClusterSpec(
        name=d["name"],
        hardware=load_hardware(d["hardware"]),
        levels=levels,
        num_devices=n,
        sizes=sizes,
        source=d["source"],
    )


def load_cluster(name_or_path: str | os.PathLike, num_devices: int | None = None) -> ClusterSpec:
    path = _resolve("clusters", name_or_path)
    try:
        return cluster_from_dict(read_yaml(path), str(path), num_devices)
    except SpecError as e:
        if "unknown hardware" in str(e):
            raise SpecError(f"{path}: key 'hardware': {e}") from None
        raise
