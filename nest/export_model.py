"""Model spec -> Megatron-LM's GPT / BERT model arguments, every one that changes the numerics.

Argument names: Megatron-LM megatron/training/arguments.py and the TransformerConfig fields it
generates flags from (NVIDIA/Megatron-LM d98e8a64). Defaults where the spec leaves a value open:
rotary base 10000 (Megatron's and Hugging Face's), norm epsilon 1e-5 (Megatron's).
"""

from __future__ import annotations

from nest.specs import ModelSpec

# ModelSpec features of newer Hugging Face families Megatron-LM's GPT arguments do not carry
UNEXPORTED = {"sandwich_norm": "--post-attention / post-MLP norms", "attn_softcap": "soft-capping",
              "final_softcap": "logit soft-capping", "sliding_window": "sliding-window layers",
              "kv_lora_rank": "multi-latent attention", "num_dense_layers": "leading dense layers",
              "shared_expert_gate": "a gated shared expert"}


def model_args(m: ModelSpec, warnings: list[str]) -> list[str]:
    """Megatron-LM's GPT / BERT model arguments, every one that changes the numerics explicit."""
    a = ["--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size),
         "--ffn-hidden-size", str(m.ffn_hidden_size), "--num-attention-heads", str(m.num_heads),
         "--seq-length", str(m.seq_len), "--max-position-embeddings", str(m.seq_len)]
    if getattr(m, "head_size", 0) and m.head_size != m.hidden_size // m.num_heads:
        a += ["--kv-channels", str(m.head_size)]
    if m.num_kv_heads != m.num_heads:
        a += ["--group-query-attention", "--num-query-groups", str(m.num_kv_heads)]
    rms = m.norm == "rmsnorm"
    a += ["--normalization", "RMSNorm" if rms else "LayerNorm",
          "--norm-epsilon", repr(float(m.norm_eps or 1e-5))]
    if m.learned_positions:
        a += ["--position-embedding-type", "learned_absolute"]
    else:  # Llama family: rotary, no biases
        a += ["--position-embedding-type", "rope", "--rotary-base",
              str(int(m.rope_theta or 10000)), "--disable-bias-linear"]
        if getattr(m, "qkv_bias", False):
            a.append("--add-qkv-bias")
    if getattr(m, "qk_norm", False):
        a.append("--qk-layernorm")
    if m.ffn_type == "swiglu":
        a.append("--swiglu")
    elif m.ffn_type != "gelu":
        warnings.append(f"ffn_type '{m.ffn_type}' has no Megatron-LM argument: exported as GELU")
    if m.is_moe:
        a += ["--num-experts", str(m.num_experts), "--moe-router-topk", str(m.top_k),
              "--moe-ffn-hidden-size", str(m.ffn_hidden_size),
              "--moe-token-dispatcher-type", "alltoall"]  # the all-to-all the evaluator prices
        if getattr(m, "shared_ffn_hidden_size", 0):
            a += ["--moe-shared-expert-intermediate-size", str(m.shared_ffn_hidden_size)]
    if not m.tied_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    if not m.has_dropout:
        a += ["--attention-dropout", "0", "--hidden-dropout", "0"]
    if m.family == "bert":
        a.append("--bert-no-binary-head")  # the layer graph has no pooler / NSP head
    left = [w for k, w in UNEXPORTED.items() if getattr(m, k, 0)]
    if left:
        warnings.append(f"{m.name} uses {', '.join(left)}: not expressed by these Megatron-LM "
                        f"arguments (add them by hand)")
    return a
