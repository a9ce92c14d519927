"""Hugging Face config.json -> ModelSpec; optionally the transformers decoder layer itself
exported with torch.export on meta tensors (per-node FLOPs read from the exported graph).

Supported `model_type`s: llama, mistral (Llama family), mixtral (MoE), gpt2 (GPT family), bert.
A config that our compact modules cannot represent exactly (biases in a Llama, a head_dim other
than hidden/heads, another activation) is refused with the file and key, never approximated.
The transformers path needs `pip install transformers` (extra `hf`); nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from nest.errors import SpecError
from nest.specs import ModelSpec, model_from_dict

_FAMILY = {"llama": "llama", "mistral": "llama", "mixtral": "mixtral", "gpt2": "gpt", "bert": "bert"}


def load_hf_config(path: str | os.PathLike) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SpecError(f"{path}: file not found") from None
    except json.JSONDecodeError as e:
        raise SpecError(f"{path}: malformed JSON: {e}") from None


def _name(cfg: dict, where: str) -> str:
    raw = cfg.get("_name_or_path") or Path(where).stem
    return re.sub(r"[^a-z0-9_]+", "_", str(raw).lower().rsplit("/", 1)[-1]).strip("_") or "hf_model"


def _require(cfg: dict, key: str, ok, where: str, what: str) -> None:
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
    if mtype not in _FAMILY:
        raise SpecError(f"{where}: key 'model_type': {mtype!r} is not supported "
                        f"(known: {', '.join(sorted(_FAMILY))})")
    family = _FAMILY[mtype]
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
        _require(cfg, "attention_bias", lambda v: not v, where, "our Llama has no biases")
        _require(cfg, "mlp_bias", lambda v: not v, where, "our Llama has no biases")
        _require(cfg, "hidden_act", lambda v: v == "silu", where, "SwiGLU needs silu")
        _require(cfg, "head_dim", lambda v: v == d["hidden_size"] // d["num_heads"], where,
                 "head_dim must be hidden_size / num_attention_heads")
    if family == "bert":
        _require(cfg, "type_vocab_size", lambda v: v == 2, where, "BERT with 2 token types")
        _require(cfg, "hidden_act", lambda v: str(v).startswith("gelu"), where, "GELU MLP")
    if family == "mixtral":
        d.update(num_experts=cfg["num_local_experts"], top_k=cfg["num_experts_per_tok"])
    d.update(name=name or _name(cfg, where), family=family, vocab_size=cfg["vocab_size"],
             causal=family != "bert")
    if parallel_variants:
        d["parallel_variants"] = parallel_variants
    return model_from_dict(d, where)


# --------------------------------------------------------------------------------------------
# The transformers module itself, exported on meta tensors
# --------------------------------------------------------------------------------------------


@dataclass
class HFBlockTrace:
    """One HF decoder layer exported with torch.export on meta tensors."""

    num_params: int  # the layer's parameters
    model_num_params: int  # the whole *ForCausalLM model's parameters
    fwd_flops: float  # per micro-batch, causal attention counted half (as closed_form)
    matmul_flops: float
    attention_flops: float
    num_nodes: int
    exported: object  # torch.export.ExportedProgram


def _node_flops(node) -> tuple[float, float]:
    """(matmul, attention) FLOPs of one exported aten node, from its fake-tensor shapes."""
    import torch
    from torch.utils.flop_counter import flop_registry

    aten = torch.ops.aten

    def val(a):
        return a.meta["val"] if hasattr(a, "meta") else a

    args = [val(a) for a in node.args]
    if node.target is aten.linear.default:
        x, w = args[0], args[1]
        return 2.0 * x.numel() // w.shape[-1] * w.shape[0] * w.shape[1], 0.0
    if node.target is aten.scaled_dot_product_attention.default:
        q, k = args[0], args[1]
        causal = node.kwargs.get("is_causal", args[5] if len(args) > 5 else False)
        flops = 4.0 * q.shape[:-2].numel() * q.shape[-2] * k.shape[-2] * q.shape[-1]
        return 0.0, flops * (0.5 if causal else 1.0)
    formula = flop_registry.get(getattr(node.target, "_overloadpacket", None))
    if formula is not None:
        return float(formula(*args, **node.kwargs, out_val=node.meta.get("val"))), 0.0
    return 0.0, 0.0


def trace_hf_block(config: dict | str | os.PathLike, *, mbs: int = 1,
                   seq_len: int | None = None) -> HFBlockTrace:
    """Build the HF *ForCausalLM on the meta device and torch.export its first decoder layer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(config) if isinstance(config, dict) else load_hf_config(config)
    spec = model_spec_from_hf_config(cfg, seq_len=seq_len)
    if spec.family not in ("llama", "mixtral"):
        raise SpecError(f"{config if not isinstance(config, dict) else '<config dict>'}: key "
                        f"'model_type': torch.export path supports the Llama family and Mixtral")
    kwargs = {k: v for k, v in cfg.items() if not k.startswith("_") and k != "model_type"}
    hf_cfg = AutoConfig.for_model(cfg["model_type"], **kwargs)
    with torch.device("meta"):
        try:  # transformers >= 5: Mixtral experts as one traceable batched matmul
            model = AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.bfloat16,
                                                     attn_implementation="sdpa",
                                                     experts_implementation="batched_mm")
        except TypeError:  # older releases (untested here; tested with transformers 5.24)
            model = AutoModelForCausalLM.from_config(hf_cfg, torch_dtype=torch.bfloat16,
                                                     attn_implementation="sdpa")
        layer, s = model.model.layers[0], spec.seq_len
        x = torch.empty(mbs, s, spec.hidden_size, dtype=torch.bfloat16)
        pos = model.model.rotary_emb(x, torch.arange(s)[None])
        exported = torch.export.export(layer, (x,), {"position_embeddings": pos,
                                                     "attention_mask": None})
    mm = att = 0.0
    for node in exported.graph.nodes:
        if node.op == "call_function":
            a, b = _node_flops(node)
            mm, att = mm + a, att + b
    return HFBlockTrace(sum(p.numel() for p in layer.parameters()),
                        sum(p.numel() for p in model.parameters()), mm + att, mm, att,
                        len(exported.graph.nodes), exported)
