"""A Hugging Face config.json -> ModelSpec: every architecture key is priced or refused by name.

Supported `model_type`s (the block each becomes in nest.graph.torch_models; parameter counts
equal transformers' meta-device count, tests/test_hf_families.py):

* llama, mistral, phi3 (fused qkv / gate_up: the same weights as Llama's), qwen2 (biases on Q, K,
  V), qwen3 (RMSNorm over each head's Q and K, head_dim key), gemma2 (head_dim key, a norm
  before and after attention and MLP, GeGLU, soft-capping, alternating sliding window) -> a dense
  "llama" family block;
* mixtral, qwen2_moe (shared expert with a sigmoid gate), qwen3_moe, olmoe (OLMo-2's whole-
  projection Q/K norms with norms before attention and MLP), deepseek_v2 / deepseek_v3
  (multi-head latent attention with q/kv LoRA ranks and a rotary part per head, shared experts,
  the first `first_k_dense_replace` blocks dense) -> "mixtral" family blocks;
* gpt2, bert.

Priced rather than ignored:
* sliding_window: the windowed blocks' attention FLOPs count the band of w keys per query
  (w^2/2 + (s-w) w of the s x s scores instead of s^2/2) and their saved scores the s x w band
  (nest.graph.torch_models.AttentionCore). Which blocks attend over the window follows
  transformers' own `layer_types` rule per family (or the config's `layer_types`).
* attn_logit_softcapping: a tanh on each score inside the attention kernel (FlashAttention-2
  >= 2.6 applies it on chip): no matmul FLOPs and no HBM bytes change, so it costs nothing here,
  as every elementwise FLOP does in this model (closed_form's conventions).
* final_logit_softcapping: an elementwise op on the logits (read, write, and the capped logits
  kept for backward), priced like the cross-entropy's bytes.
* rope_scaling / rope_parameters (linear, dynamic, yarn, longrope, llama3) and
  partial_rotary_factor change only the rotation frequencies (yarn / longrope also a constant
  attention temperature): no matmul FLOPs, no bytes, no parameters. Accepting them is exact for
  this cost model. An unknown rope type is refused.
Refused with the key: dropout > 0 in a decoder family, biases other than the ones above, other
activations, MoE layer patterns other than "every layer" / "the first k dense", mlp_only_layers.

The training sequence length is not in a config.json (max_position_embeddings is the longest
context, 131072 for Llama-3.1): pass `seq_len` (CLI --seq-len, a figure's seq_len). Without it a
RoPE model gets DEFAULT_SEQ_LEN (capped at max_position_embeddings) with a warning; GPT-2 and
BERT (learned positions) get their position table's length.

Parallel variants, unless given: every tp <= NODE_SIZE dividing the attention heads, KV heads,
every MLP width and the sequence (sp splits it over tp); sp both ways; every power-of-two
ep <= MAX_EP dividing the routed experts; every cp in {1, 2, 4, 8} dividing the sequence (with
tp under sp).
"""

from __future__ import annotations

import math
import os
import re
import warnings
from pathlib import Path

from nest.common.errors import SpecError, short
from nest.graph.hf_keys import check_keys
from nest.spec.catalog import ModelSpec, load_hf_config, model_from_dict, validate

DEFAULT_SEQ_LEN = 4096  # Llama-3 pre-training's 8192 halved: the common fine-tuning length
NODE_SIZE = 8  # tp and cp up to one 8-GPU node (every catalog cluster's innermost level)
MAX_EP = 64  # the largest expert-parallel group of a published recipe (DeepSeek-V3: EP 64)
CP_SIZES = (1, 2, 4, 8)

FAMILY = {"llama": "llama", "mistral": "llama", "phi3": "llama", "qwen2": "llama",
          "qwen3": "llama", "gemma2": "llama", "gemma3_text": "llama", "olmo2": "llama",
          "mixtral": "mixtral", "qwen2_moe": "mixtral", "qwen3_moe": "mixtral",
          "deepseek_v2": "mixtral", "deepseek_v3": "mixtral", "gpt_oss": "mixtral",
          "olmoe": "mixtral",
          "gpt2": "gpt", "bert": "bert"}
GEMMA = ("gemma2", "gemma3_text")
# transformers' Gemma3TextConfig defaults for the keys hf_spec reads with another default of its
# own: google/gemma-3-4b/12b/27b-pt publish a text_config without vocab_size, rms_norm_eps,
# rope_theta or max_position_embeddings (refused as "vocab_size: required" before); gemma-3-4b-pt
# states no heads either (its 8 query / 4 KV heads are the defaults). The widths and the depth
# (hidden_size, intermediate_size, num_hidden_layers) stay required.
GEMMA3_TEXT_DEFAULTS = {"vocab_size": 262208, "num_attention_heads": 8, "num_key_value_heads": 4,
                        "head_dim": 256,
                        "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
                        "rope_theta": 1000000.0, "sliding_window": 4096,
                        "query_pre_attn_scalar": 256, "hidden_activation": "gelu_pytorch_tanh",
                        "tie_word_embeddings": True}
ROPE_TYPES = {"default", "linear", "dynamic", "yarn", "longrope", "llama3", "su"}


def _name(cfg: dict, where: str) -> str:
    """The model's name: the config's _name_or_path, else the file's name, else (a file named
    config.json, as every hub download is) its folder's, or the repository's for a hub-cache
    snapshot (models--ORG--NAME/snapshots/HASH/config.json)."""
    p = Path(where)
    raw = cfg.get("_name_or_path") or p.stem
    if not cfg.get("_name_or_path") and p.name == "config.json":
        hub = [x for x in p.parts if x.startswith("models--")]
        raw = hub[-1].rsplit("--", 1)[-1] if hub else (p.parent.name or raw)
    return re.sub(r"[^a-z0-9_]+", "_", str(raw).lower().rsplit("/", 1)[-1]).strip("_") or "hf_model"


class _Cfg:
    """The config dict with the file name for messages."""

    def __init__(self, cfg: dict, where: str):
        self.cfg, self.where = cfg, where

    def get(self, key, default=None):
        v = self.cfg.get(key)
        return default if v is None else v

    def need(self, key):
        if self.cfg.get(key) is None:
            raise SpecError(f"{self.where}: key '{key}': required for model_type "
                            f"'{self.cfg.get('model_type')}'")
        return self.cfg[key]

    def refuse(self, key, ok, what: str) -> None:
        v = self.cfg.get(key)
        if v is not None and not ok(v):
            raise SpecError(f"{self.where}: key '{key}': {short(v)} is not supported ({what})")


def _rope(c: _Cfg) -> str:
    """'' or the config's RoPE scaling as 'TYPE key=value ...' (sorted numeric keys), for the
    export to state; an unknown type is refused."""
    out = ""
    for key in ("rope_scaling", "rope_parameters"):
        r = _full_attention(c.cfg.get(key))
        if isinstance(r, dict):
            kind = r.get("rope_type", r.get("type", "default"))
            if kind not in ROPE_TYPES:
                raise SpecError(f"{c.where}: key '{key}.rope_type': {short(kind)} is not supported "
                                f"(known: {', '.join(sorted(ROPE_TYPES))}; a RoPE variant "
                                f"changes no FLOPs only when it is one of these)")
            if kind != "default" and not out:
                # a flag (YaRN's truncate: round the correction range or not) as 0 / 1
                out = " ".join([str(kind)] + [f"{k}={int(v) if isinstance(v, bool) else v}"
                                              for k, v in sorted(r.items())
                                              if isinstance(v, (int, float)) and k != "rope_theta"])
    return out[:400]


def _full_attention(r):
    """transformers >= 5 writes `rope_parameters` per layer type for Gemma-3 ({"full_attention":
    {...}, "sliding_attention": {...}}): the global layers' entry, the one base and scaling
    Megatron-LM's arguments state; any other value as it is."""
    return r["full_attention"] if isinstance(r, dict) and isinstance(r.get("full_attention"),
                                                                     dict) else r


def _rope_theta(cfg: dict) -> float | None:
    """The RoPE base: `rope_theta`, or (transformers >= 5 writes it there, with no top-level key)
    `rope_parameters.rope_theta`; a config saved so exported --rotary-base 10000 instead."""
    theta = cfg.get("rope_theta")
    rp = _full_attention(cfg.get("rope_parameters"))
    if theta is None and isinstance(rp, dict):
        theta = rp.get("rope_theta")
    return None if theta is None else float(theta)


def _window_layers(c: _Cfg, mtype: str, n: int) -> tuple[int, tuple[int, ...]]:
    """(window, windowed block indices) by transformers' layer_types rule of each family."""
    types = c.cfg.get("layer_types")
    w = c.get("sliding_window", 0)
    # google/gemma-2-9b and -27b's published configs repeat the window as `sliding_window_size`
    # (a key Gemma2Config never reads): accepted only when it states the same window
    c.refuse("sliding_window_size", lambda v: mtype == "gemma2" and v == w,
             f"only Gemma-2's repeat of 'sliding_window' ({short(w)}), which transformers ignores")
    if mtype in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and not c.get("use_sliding_window",
                                                                            False):
        w = 0
    if not w:
        return 0, ()
    if types is not None:
        bad = [t for t in types if t not in ("sliding_attention", "full_attention")]
        if len(types) != n or bad:
            raise SpecError(f"{c.where}: key 'layer_types': expected {n} entries, each "
                            f"'sliding_attention' or 'full_attention' (got {len(types)}"
                            f"{', ' + short(bad[0]) if bad else ''})")
        layers = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    elif mtype in ("gemma2", "gpt_oss"):  # their configs: sliding on even blocks, global on odd
        layers = tuple(i for i in range(n) if (i + 1) % 2)
    elif mtype == "gemma3_text":  # Gemma3TextConfig: 5 local blocks, then 1 global (pattern 6)
        p = c.get("sliding_window_pattern", 6)
        layers = tuple(i for i in range(n) if (i + 1) % p)
    elif mtype in ("qwen2", "qwen3"):  # Qwen2Config: sliding from max_window_layers on
        layers = tuple(i for i in range(n) if i >= c.get("max_window_layers", n))
    elif mtype in ("qwen2_moe", "qwen3_moe"):
        layers = tuple(i for i in range(n) if (i + 1) % 2 and i < c.get("max_window_layers", n))
    elif mtype in ("mistral", "phi3", "mixtral"):  # every block
        layers = tuple(range(n))
    else:
        raise SpecError(f"{c.where}: key 'sliding_window': {w} is not supported for model_type "
                        f"'{mtype}'")
    return int(w), layers


def _seq_len(c: _Cfg, family: str, seq_len: int | None) -> int:
    max_pos = c.get("n_positions") if family == "gpt" else c.get("max_position_embeddings")
    if seq_len is not None:
        if seq_len < 1:
            raise SpecError(f"{c.where}: seq_len={seq_len} must be positive")
        if family in ("gpt", "bert") and max_pos and seq_len > max_pos:
            raise SpecError(f"{c.where}: seq_len={seq_len} exceeds the learned position table "
                            f"(key '{'n_positions' if family == 'gpt' else 'max_position_embeddings'}'"
                            f" = {max_pos})")
        if max_pos and seq_len > max_pos:
            warnings.warn(f"{c.where}: seq_len={seq_len} exceeds max_position_embeddings="
                          f"{max_pos}", stacklevel=3)
        return int(seq_len)
    if family in ("gpt", "bert"):
        return int(max_pos)
    s = min(DEFAULT_SEQ_LEN, max_pos or DEFAULT_SEQ_LEN)
    warnings.warn(f"{c.where}: no training sequence length given; using seq_len={s} (not "
                  f"max_position_embeddings={max_pos}); pass --seq-len or a figure's seq_len",
                  stacklevel=3)
    return s


def _decoder(c: _Cfg, mtype: str) -> dict:
    """The fields of a RoPE decoder (llama / mixtral families)."""
    h, a = c.need("hidden_size"), c.need("num_attention_heads")
    n = c.need("num_hidden_layers")
    for key in ("attention_dropout", "resid_pdrop", "embd_pdrop", "hidden_dropout"):
        c.refuse(key, lambda v: v == 0, "dropout in a decoder is not modelled")
    c.refuse("mlp_bias", lambda v: not v, "MLP biases are not modelled")
    # Phi-4-mini's keys of its original code (hf_keys): every layer dense, no interpolation, no
    # LM-head bias is what transformers builds; another value would be a model it does not
    c.refuse("full_attn_mod", lambda v: v == 1, "only 1: every layer full attention")
    c.refuse("interpolate_factor", lambda v: v == 1, "only 1: no position interpolation")
    c.refuse("lm_head_bias", lambda v: v is False, "an LM-head bias is not modelled")
    rope = _rope(c)
    kv = c.get("num_key_value_heads", a)
    if a % kv:  # checked again on the ModelSpec, whose key names are not the config's
        raise SpecError(f"{c.where}: key 'num_key_value_heads': {kv} must divide "
                        f"num_attention_heads ({a})")
    d = dict(num_layers=n, hidden_size=h, num_heads=a, num_kv_heads=kv,
             ffn_hidden_size=c.need("intermediate_size"), ffn_type="swiglu",
             tied_embeddings=bool(c.get("tie_word_embeddings", mtype in GEMMA)))
    if rope:
        d["rope_scaling"] = rope
    rp = _full_attention(c.cfg.get("rope_parameters"))  # transformers >= 5 may write it there
    partial = c.get("partial_rotary_factor", rp.get("partial_rotary_factor")
                    if isinstance(rp, dict) else None)
    if partial is not None and (isinstance(partial, bool) or not isinstance(partial, (int, float))
                                or not 0 < partial <= 1):
        raise SpecError(f"{c.where}: key 'rope_parameters.partial_rotary_factor': "
                        f"{short(partial)}: expected a number in (0, 1]")
    if partial is not None and partial != 1:
        d["rotary_percent"] = float(partial)
    if mtype == "qwen2":
        d["qkv_bias"] = True  # Qwen2Attention: bias=True on q, k, v (hard-coded)
    elif mtype == "qwen2_moe":
        d["qkv_bias"] = bool(c.get("qkv_bias", True))
    if mtype == "gpt_oss":  # biases on Q, K, V, out, router and experts; a sink logit per head
        c.refuse("attention_bias", lambda v: v, "gpt-oss: its attention has biases")
        d.update(linear_bias=True, attention_sinks=True)
        # its experts clamp the GLU input (transformers' GptOssExperts: gate.clamp(max=limit),
        # up.clamp(-limit, limit)); Megatron-Core runs that as separate kernels (ModelSpec)
        # (transformers' GptOssConfig default: 7.0)
        c.refuse("swiglu_limit", lambda v: isinstance(v, (int, float))
                 and not isinstance(v, bool) and v >= 0, "expected a number >= 0")
        d["glu_clamp"] = float(c.get("swiglu_limit", 7.0))
    elif mtype not in ("qwen2", "qwen2_moe"):
        c.refuse("attention_bias", lambda v: not v, "attention biases are not modelled")
    if mtype in ("qwen3", "qwen3_moe", "gemma3_text"):
        d["qk_norm"] = True  # RMSNorm over each head's Q and K
    if mtype == "olmo2":  # RMSNorm over the whole Q and K projections; norms after, not before
        d.update(qk_norm=True, qk_norm_full=True, pre_norm=False)
    if mtype == "olmoe":  # the same Q / K norms (OlmoeAttention), norms before (OlmoeDecoderLayer)
        d.update(qk_norm=True, qk_norm_full=True)
        c.refuse("clip_qkv", lambda v: False, "clamping Q, K and V is not modelled")
    head_dim = c.get("head_dim")
    if head_dim and head_dim != h // a and mtype in ("qwen3", "qwen3_moe", "mistral", "qwen2",
                                                     "qwen2_moe", "llama", "mixtral", "olmo2",
                                                     "gpt_oss", *GEMMA):
        d["head_size"] = head_dim
    elif head_dim and head_dim != h // a and mtype not in ("deepseek_v2", "deepseek_v3"):
        raise SpecError(f"{c.where}: key 'head_dim': {head_dim} != hidden_size / "
                        f"num_attention_heads is not supported for model_type '{mtype}'")
    rot = d.get("head_size") or h // a
    if mtype not in ("deepseek_v2", "deepseek_v3") and h % a == 0 and rot % 2:
        raise SpecError(f"{c.where}: key '{'head_dim' if d.get('head_size') else 'hidden_size'}'"
                        f": the head dimension is {rot}, odd; rotary position embeddings need "
                        f"an even one")
    if mtype in GEMMA:
        c.refuse("use_bidirectional_attention", lambda v: not v, "causal attention only")
        act = c.get("hidden_activation", c.get("hidden_act", "gelu_pytorch_tanh"))
        if not str(act).startswith("gelu"):
            raise SpecError(f"{c.where}: key 'hidden_activation': {short(act)} is not supported "
                            f"(Gemma's GeGLU)")
        d.update(ffn_type="geglu", sandwich_norm=True,
                 attn_softcap=float(c.get("attn_logit_softcapping", 0.0)),
                 final_softcap=float(c.get("final_logit_softcapping", 0.0)))
        # no cost, but numerics a Megatron-LM export must be told of (Gemma2 / Gemma3 modeling:
        # the embeddings times sqrt(hidden_size), RMSNorm's gain 1 + w, the scores scaled by
        # query_pre_attn_scalar ** -0.5 rather than head_dim ** -0.5)
        notes = ["embeddings scaled by sqrt(hidden_size)", "RMSNorm gain 1 + w"]
        q, hd = c.get("query_pre_attn_scalar"), d.get("head_size") or h // a
        if q is not None and q != hd:
            notes.append(f"softmax scale 1/sqrt({short(q)}) (query_pre_attn_scalar; head_dim "
                         f"is {hd})")
        d["numerics_notes"] = notes
    else:
        c.refuse("hidden_act", lambda v: v == "silu", "the gated MLP needs silu (SwiGLU)")
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            c.refuse(key, lambda v: not v, "soft-capping is modelled for gemma2 / gemma3 only")
    w, layers = _window_layers(c, mtype, n)
    if w:
        d.update(sliding_window=w, window_layers=list(layers))
    if w and mtype == "gemma3_text":  # Gemma3RotaryEmbedding: the windowed layers rotate at
        # rope_local_base_freq, unscaled (transformers >= 5: rope_parameters.sliding_attention;
        # Gemma3TextConfig's default 10000); the global layers at rope_theta with the scaling
        local = c.get("rope_local_base_freq")
        sliding = (c.get("rope_parameters") or {}).get("sliding_attention")
        if local is None and isinstance(sliding, dict):
            local = sliding.get("rope_theta")
        d["rope_local_theta"] = float(local if local is not None else 10000.0)
    return d


def _router(c: _Cfg, mtype: str) -> tuple[str, list[str]]:
    """The router's numerics as ModelSpec.router (no cost: every routing is priced balanced) and
    the parts Megatron-LM's router cannot state. transformers' modeling per family: Mixtral and
    gpt-oss take the softmax of the top-k logits (Megatron-LM's default); Qwen2/3-MoE, OLMoE and
    DeepSeek-V2 take the top k of a softmax over every expert and renormalise only under
    norm_topk_prob (default false: Megatron's --moe-router-pre-softmax); DeepSeek-V3 selects on
    sigmoid scores plus a per-expert bias inside the best topk_group of n_group groups,
    renormalises (norm_topk_prob) and scales by routed_scaling_factor (megatron-core
    moe_utils.topk_routing_with_score_function; Megatron-Bridge's DeepSeek bridges)."""
    if mtype in ("mixtral", "gpt_oss"):
        return "", []
    v3 = mtype == "deepseek_v3"
    tokens, notes = [], []
    score = c.get("scoring_func", "sigmoid" if v3 else "softmax")
    renorm = bool(c.get("norm_topk_prob", v3))
    if score == "sigmoid":
        tokens.append("sigmoid")
        if not renorm:
            notes.append("sigmoid routing weights not renormalised over the top k "
                         "(norm_topk_prob false; Megatron-LM renormalises them)")
    elif score == "softmax":
        if not renorm:
            tokens.append("pre_softmax")
    else:
        notes.append(f"router score function {short(score)} (scoring_func)")
    if v3 or c.get("topk_method") == "noaux_tc":
        tokens.append("expert_bias")
    scale = float(c.get("routed_scaling_factor", 2.5 if v3 else 1.0))
    if scale != 1.0:
        tokens.append(f"scale={scale!r}")
    groups, group_k = int(c.get("n_group", 8 if v3 else 1)), int(c.get("topk_group", 4 if v3
                                                                          else 1))
    if groups > 1 and (v3 or c.get("topk_method") == "group_limited_greedy"):
        tokens += [f"groups={groups}", f"group_topk={group_k}"]
        if not v3:
            notes.append("groups ranked by their best expert (DeepSeek-V2's group_limited_greedy;"
                         " Megatron-LM ranks them by the sum of their top k / group_topk)")
    return " ".join(tokens), notes


def _balance_loss(c: _Cfg, mtype: str) -> tuple[str, float]:
    """The load-balancing loss and its coefficient as Megatron-Bridge maps a Hugging Face config
    (model_bridge.CONFIG_MAPPING: router_aux_loss_coef and aux_loss_alpha -> moe_aux_loss_coeff;
    its DeepSeek-V2 / V3 bridges: seq_aux_loss, DeepSeek's `seq_aux`; its gpt-oss bridge: none).
    An absent key is the config class's default: transformers' router_aux_loss_coef 0.001
    (OLMoE 0.01);
    DeepSeek's aux_loss_alpha 0.001 (deepseek-ai's DeepseekV2Config), 0.0001 for V3 (its report,
    section 4.2, and Megatron-Bridge's V3 bridge)."""
    if mtype == "gpt_oss":
        return "none", 0.0
    if mtype in ("deepseek_v2", "deepseek_v3"):
        coeff = c.get("aux_loss_alpha", 0.0001 if mtype == "deepseek_v3" else 0.001)
        kind = "seq_aux_loss" if c.get("seq_aux", True) else "aux_loss"
    else:  # transformers' OlmoeConfig: 0.01
        coeff = c.get("router_aux_loss_coef", 0.01 if mtype == "olmoe" else 0.001)
        kind = "aux_loss"
    return kind, float(coeff)


def _moe(c: _Cfg, mtype: str, d: dict) -> None:
    n = d["num_layers"]
    d["router"], notes = _router(c, mtype)
    d["balance_loss"], d["aux_loss_coeff"] = _balance_loss(c, mtype)
    if notes:
        d["numerics_notes"] = list(d.get("numerics_notes", [])) + notes
    if mtype in ("mixtral", "gpt_oss"):  # gpt-oss: intermediate_size is each expert's width
        d.update(num_experts=c.need("num_local_experts"), top_k=c.need("num_experts_per_tok"))
        return
    if mtype == "olmoe":  # intermediate_size is each expert's width; no shared expert
        d.update(num_experts=c.need("num_experts"), top_k=c.need("num_experts_per_tok"))
        return
    d["top_k"] = c.need("num_experts_per_tok")
    if mtype in ("qwen2_moe", "qwen3_moe"):
        c.refuse("decoder_sparse_step", lambda v: v == 1, "MoE in every block only")
        c.refuse("mlp_only_layers", lambda v: not v, "dense blocks between MoE blocks are not "
                 "modelled")
        E = c.get("num_experts", c.get("num_local_experts"))  # the latter: transformers >= 5
        c.refuse("num_local_experts", lambda v: v == E, f"it repeats num_experts ({short(E)})")
        if E is None:
            c.need("num_experts")
        d.update(num_experts=E, ffn_hidden_size=c.need("moe_intermediate_size"))
        if mtype == "qwen2_moe" and c.get("shared_expert_intermediate_size", 0):
            d.update(shared_ffn_hidden_size=c.cfg["shared_expert_intermediate_size"],
                     shared_expert_gate=True)
        return
    # DeepSeek-V2 / V3
    c.refuse("moe_layer_freq", lambda v: v == 1, "MoE in every block after the first dense ones")
    E = c.need("n_routed_experts")
    k_dense = c.get("first_k_dense_replace", 0)
    f_moe = c.need("moe_intermediate_size")
    d.update(num_experts=E, ffn_hidden_size=f_moe, num_dense_layers=min(k_dense, n),
             dense_ffn_hidden_size=c.need("intermediate_size"),
             shared_ffn_hidden_size=f_moe * c.get("n_shared_experts", 0))
    if k_dense >= n:
        raise SpecError(f"{c.where}: key 'first_k_dense_replace': {k_dense} leaves no MoE block")
    # multi-token prediction (DeepSeek-V3, section 2.2): priced as modules after the head (not
    # part of the transformers model: its parameters come on top of transformers' count)
    d["mtp_layers"] = int(c.get("num_nextn_predict_layers", 0))
    # multi-head latent attention (DeepSeek-V2, section 2.1.2)
    nope, rope, vd = c.need("qk_nope_head_dim"), c.need("qk_rope_head_dim"), c.need("v_head_dim")
    c.refuse("qk_head_dim", lambda v: v == nope + rope,
             f"transformers' qk_nope_head_dim + qk_rope_head_dim ({nope + rope})")
    d.update(kv_lora_rank=c.need("kv_lora_rank"), q_lora_rank=c.get("q_lora_rank", 0),
             qk_rope_head_dim=rope, v_head_dim=vd, head_size=nope + rope,
             num_kv_heads=d["num_heads"])
    c.refuse("attention_bias", lambda v: not v, "MLA biases are not modelled")


def derive_variants(d: dict) -> dict:
    """Parallel variants from the architecture (module docstring)."""
    a, kv = d["num_heads"], d.get("num_kv_heads", d["num_heads"])
    widths = [d["ffn_hidden_size"], d.get("shared_ffn_hidden_size") or 0,
              d.get("dense_ffn_hidden_size") or 0]
    g = math.gcd(a, kv, *widths)
    s = d["seq_len"]
    # tp also divides the sequence: sp splits it over tp (Phi-3-medium's 40 / 10 heads allow
    # tp 5, which splits no 4096-token sequence and left no cp at all)
    tps = [t for t in range(1, NODE_SIZE + 1) if g % t == 0 and s % t == 0]
    tmax = max(tps)
    cps = [c for c in CP_SIZES if s % (c * tmax) == 0]
    E = d.get("num_experts", 1)
    # powers of two only: ep divides the data-parallel size, a divisor of a power-of-two GPU
    # count on every catalog cluster (Qwen1.5-MoE's 60 experts: ep 1, 2, 4, not 3, 5, 6, 10 ...)
    eps = [e for e in range(1, min(E, MAX_EP) + 1) if E % e == 0 and not e & (e - 1)]
    return {"tp": tps, "sp": [False, True] if tmax > 1 else [False], "ep": eps, "cp": cps}


def model_spec_from_hf_config(config: dict | str | os.PathLike, *, name: str | None = None,
                              seq_len: int | None = None,
                              parallel_variants: dict | None = None) -> ModelSpec:
    """A HF config (dict or path to config.json) as our ModelSpec (validated like a catalog
    YAML). seq_len: the training sequence length (module docstring for its default)."""
    where = "<config dict>" if isinstance(config, dict) else str(config)
    cfg = config if isinstance(config, dict) else load_hf_config(config)
    if cfg.get("model_type") == "gemma3" and isinstance(cfg.get("text_config"), dict):
        warnings.warn(f"{where}: model_type 'gemma3' (image and text): planning its text decoder "
                      f"(key 'text_config'); the SigLIP vision tower and projector are not "
                      f"planned", stacklevel=2)
        cfg = {"_name_or_path": cfg.get("_name_or_path"), "model_type": "gemma3_text",
               **cfg["text_config"]}
    if cfg.get("model_type") == "gemma3_text" and "rope_parameters" not in cfg:
        cfg = {**GEMMA3_TEXT_DEFAULTS, **cfg}  # an absent key is transformers' default
    elif cfg.get("model_type") == "gemma3_text":  # transformers >= 5: rope_theta lives there
        cfg = {**{k: v for k, v in GEMMA3_TEXT_DEFAULTS.items() if k != "rope_theta"}, **cfg}
    validate(cfg, "hf_config", where)  # types, ranges and finiteness before any arithmetic
    check_keys(cfg, where)
    c = _Cfg(cfg, where)
    mtype = cfg.get("model_type")
    if mtype not in FAMILY:
        raise SpecError(f"{where}: key 'model_type': {short(mtype)} is not supported "
                        f"(known: {', '.join(sorted(FAMILY))})")
    family = FAMILY[mtype]
    if family == "gpt":
        h = c.need("n_embd")
        d = dict(num_layers=c.need("n_layer"), hidden_size=h, num_heads=c.need("n_head"),
                 ffn_hidden_size=c.get("n_inner") or 4 * h, ffn_type="gelu",
                 tied_embeddings=bool(c.get("tie_word_embeddings", True)))
    elif family == "bert":
        c.refuse("type_vocab_size", lambda v: v == 2, "BERT with 2 token types")
        c.refuse("hidden_act", lambda v: str(v).startswith("gelu"), "GELU MLP")
        d = dict(num_layers=c.need("num_hidden_layers"), hidden_size=c.need("hidden_size"),
                 num_heads=c.need("num_attention_heads"),
                 ffn_hidden_size=c.need("intermediate_size"), ffn_type="gelu",
                 tied_embeddings=bool(c.get("tie_word_embeddings", True)))
    else:
        d = _decoder(c, mtype)
        if family == "mixtral":
            _moe(c, mtype, d)
            if d["top_k"] > d["num_experts"]:  # named as the config names it
                raise SpecError(f"{where}: key 'num_experts_per_tok': {d['top_k']} exceeds the "
                                f"{d['num_experts']} routed experts")
    d.update(name=name or _name(cfg, where), family=family, vocab_size=c.need("vocab_size"),
             causal=family != "bert", seq_len=_seq_len(c, family, seq_len))
    # numerics the export passes on (--rotary-base, --norm-epsilon): the config's own values
    if family not in ("gpt", "bert") and _rope_theta(cfg) is not None:
        d["rope_theta"] = _rope_theta(cfg)
    eps = next((cfg[k] for k in ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon")
                if cfg.get(k) is not None), None)
    if eps is not None:
        d["norm_eps"] = float(eps)
    d["parallel_variants"] = parallel_variants or (
        derive_variants(d) if family in ("llama", "mixtral") else None)
    if d["parallel_variants"] is None:
        del d["parallel_variants"]
    return model_from_dict(d, where)
