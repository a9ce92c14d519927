"""A Hugging Face model's transformers decoder layer itself, exported with torch.export on meta
tensors (per-node FLOPs read from the exported graph): the cross-check of our compact modules.

The config.json -> ModelSpec translation lives in nest.graph.hf_spec (model_spec_from_hf_config,
which nest.spec.catalog.load_model uses for a .json path; supported `model_type`s, what is priced and
what is refused are documented there) and is re-exported here. The transformers path needs `pip install
transformers` (extra `hf`); nothing is downloaded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from nest.common.errors import SpecError
from nest.graph.hf_spec import model_spec_from_hf_config
from nest.spec.catalog import load_hf_config

__all__ = ["HFBlockTrace", "load_hf_config", "model_spec_from_hf_config", "trace_hf_block"]


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
