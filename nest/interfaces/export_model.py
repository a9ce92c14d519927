"""Model spec -> Megatron-LM's GPT / BERT model arguments, every one that changes the numerics.

Argument names: Megatron-LM megatron/training/arguments.py and the TransformerConfig fields it
generates flags from (NVIDIA/Megatron-LM d98e8a64). Defaults where the spec leaves a value open:
rotary base 10000 (Megatron's and Hugging Face's), norm epsilon 1e-5 (Megatron's).
"""

from __future__ import annotations

from nest.spec.catalog import ModelSpec

# ModelSpec features of newer Hugging Face families Megatron-LM's GPT arguments do not carry
UNEXPORTED = {"sandwich_norm": "--post-attention / post-MLP norms", "attn_softcap": "soft-capping",
              "final_softcap": "logit soft-capping",
              "qk_norm_full": "a Q/K norm over the whole projection (exported per head)"}
MTP_LOSS_SCALE = 0.1  # Megatron-LM's default --mtp-loss-scaling-factor (DeepSeek-V3: 0.3 early,
# then 0.1; section 4.2)


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
    else:  # Llama family: rotary, no biases (gpt-oss: biases on every linear)
        theta = float(m.rope_theta or 10000)  # the default base (module docstring)
        a += ["--position-embedding-type", "rope", "--rotary-base", str(int(theta))]
        if m.rotary_percent != 1:  # Hugging Face partial_rotary_factor
            a += ["--rotary-percent", repr(m.rotary_percent)]
        if m.rope_local_theta and (m.rope_scaling or m.rope_local_theta != theta):
            # one rotary base and scaling for every layer in Megatron-LM's arguments
            scaled = f" with RoPE scaling ({m.rope_scaling})" if m.rope_scaling else ""
            warnings.append(f"{m.name} rotates its global-attention layers at base {theta:g}"
                            f"{scaled} and its windowed layers at base {m.rope_local_theta:g} "
                            f"unscaled (rope_local_base_freq {m.rope_local_theta:g}): exported "
                            f"as --rotary-base {int(theta)} on every layer"
                            f"{', unscaled' if scaled else ''} (add the windowed layers' rotary "
                            f"by hand)")
        elif m.rope_scaling:
            scaling = _rope_scaling_args(m, warnings)
            if scaling[:2] == ["--position-embedding-type", "yarn"]:  # replaces rope
                a[a.index("--position-embedding-type") + 1] = "yarn"
                scaling = scaling[2:]
            a += scaling
        if not m.linear_bias:  # Megatron-LM's default adds them (gpt-oss keeps the default)
            a.append("--disable-bias-linear")
        if getattr(m, "qkv_bias", False):
            a.append("--add-qkv-bias")
    if m.is_mla:  # DeepSeek-V2/V3 multi-latent attention (Megatron-LM MLATransformerConfig)
        a += ["--multi-latent-attention", "--kv-lora-rank", str(m.kv_lora_rank),
              "--qk-head-dim", str(m.head_dim - m.qk_rope_head_dim),
              "--qk-pos-emb-head-dim", str(m.qk_rope_head_dim), "--v-head-dim", str(m.v_head_dim)]
        if m.q_lora_rank:
            a += ["--q-lora-rank", str(m.q_lora_rank)]
        # DeepSeek's RMSNorm on the compressed latents (transformers' kv_a_layernorm, and
        # q_a_layernorm with a Q LoRA rank; priced and counted in the graph): megatron-core's MLA
        # spec builds them only under qk_layernorm (gpt_layer_specs: linear_q/kv_up_proj become
        # layer-norm linears), else IdentityOp; Megatron-Bridge's DeepSeek bridges set it
        a.append("--qk-layernorm")
    if m.attention_sinks:  # gpt-oss: a learned sink logit per head
        a += ["--softmax-type", "learnable"]
    if windowed(m):
        a += _window_args(m, warnings)
    if getattr(m, "qk_norm", False) and not m.is_mla:
        a.append("--qk-layernorm")
    if m.ffn_type == "swiglu":
        a.append("--swiglu")
    elif m.ffn_type != "gelu":
        warnings.append(f"ffn_type '{m.ffn_type}' has no Megatron-LM argument: exported as GELU")
    if m.is_moe:
        a += ["--num-experts", str(m.num_experts), "--moe-router-topk", str(m.top_k),
              "--moe-ffn-hidden-size", str(m.ffn_hidden_size),
              "--moe-token-dispatcher-type", "alltoall",  # the all-to-all the evaluator prices
              "--moe-grouped-gemm"]  # the local experts as one batched GEMM, as priced
        if m.balance_loss in ("", "aux_loss", "seq_aux_loss"):  # "": Megatron-LM's own advice
            a += ["--moe-router-load-balancing-type", m.balance_loss or "aux_loss",
                  "--moe-aux-loss-coeff", repr(m.aux_loss_coeff) if m.balance_loss else "1e-2"]
        else:
            a += ["--moe-router-load-balancing-type", m.balance_loss]
        router = m.router
        if m.top_k == 1 and not {"pre_softmax", "sigmoid"} & set(router.split()):
            # the softmax of one logit is 1: the router would get no gradient, and megatron-core
            # refuses it ("Please use --moe-router-pre-softmax when topk is 1",
            # TransformerConfig.__post_init__); the runnable top-1 router is Switch's
            router = f"pre_softmax {router}".strip()
            warnings.append(f"{m.name} routes each token to 1 expert with the softmax taken "
                            f"after the top-1 choice (a weight of 1), which Megatron-LM refuses: "
                            f"exported with --moe-router-pre-softmax (the weight is the chosen "
                            f"expert's softmax probability, as in Switch Transformer)")
        a += _router_args(router)
        if getattr(m, "shared_ffn_hidden_size", 0):
            a += ["--moe-shared-expert-intermediate-size", str(m.shared_ffn_hidden_size)]
        if getattr(m, "shared_expert_gate", False):
            # Qwen2-MoE's sigmoid(x w) gate on the shared expert, w of 1 x hidden: megatron-core
            # SharedExpertMLP(gate=True) (TransformerConfig.moe_shared_expert_gate; checked with
            # a megatron-core 0.20.0 checkout, scripts/check_megatron_args.py)
            a.append("--moe-shared-expert-gate")
        if m.num_dense_layers:  # DeepSeek: the first blocks dense, of their own width
            a[a.index("--ffn-hidden-size") + 1] = str(m.dense_ffn_hidden_size)
            pattern = [0] * m.num_dense_layers + [1] * (m.num_layers - m.num_dense_layers)
            a += ["--moe-layer-freq", _freq(pattern)]
    if m.mtp_layers:  # DeepSeek-V3 multi-token prediction, on the last pipeline stage
        a += ["--mtp-num-layers", str(m.mtp_layers), "--mtp-loss-scaling-factor",
              repr(MTP_LOSS_SCALE)]
    if not m.tied_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    if not m.has_dropout:
        a += ["--attention-dropout", "0", "--hidden-dropout", "0"]
    if m.family == "bert":
        a.append("--bert-no-binary-head")  # the layer graph has no pooler / NSP head
    left = [w for k, w in UNEXPORTED.items() if getattr(m, k, 0)] + list(m.numerics_notes)
    if left:
        warnings.append(f"{m.name} uses {', '.join(left)}: not expressed by these Megatron-LM "
                        f"arguments (add them by hand)")
    return a


def _router_args(router: str) -> list[str]:
    """ModelSpec.router -> megatron-core's router arguments (TransformerConfig moe_router_*;
    topk_routing_with_score_function): the default is the softmax of the top-k logits."""
    flags = {"pre_softmax": ["--moe-router-pre-softmax"],
             "sigmoid": ["--moe-router-score-function", "sigmoid"],
             "expert_bias": ["--moe-router-enable-expert-bias"]}
    values = {"scale": "--moe-router-topk-scaling-factor", "groups": "--moe-router-num-groups",
              "group_topk": "--moe-router-group-topk"}
    a: list[str] = []
    for tok in router.split():
        key, _, val = tok.partition("=")
        a += [values[key], val] if val else flags[key]
    return a


# Megatron-LM's --use-rope-scaling: Llama 3.x's scaling with these constants fixed
# (megatron/core/models/common/embeddings/rotary_pos_embedding.py, _apply_scaling); only the
# factor is an argument
MEGATRON_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192.0}


# the YaRN keys Megatron-LM's yarn position embedding takes (megatron/training/arguments.py:
# --rotary-scaling-factor, --yarn-original-max-position-embeddings, --yarn-beta-fast / -slow,
# --mscale, --mscale-all-dim, --[no-]yarn-correction-range-round-to-int); any other (an explicit
# attention_factor, ...) leaves the scaling to a warning
YARN_KEYS = {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim", "truncate"}
# megatron-core MLATransformerConfig's YaRN fields that no Megatron-LM argument sets (its
# argument_utils maps only --rotary-scaling-factor, --mscale and --mscale-all-dim onto them;
# the --yarn-* arguments fill the non-MLA yarn_* attributes); Hugging Face DeepSeek's defaults too
MEGATRON_MLA_YARN = {"original_max_position_embeddings": 4096.0, "beta_fast": 32.0,
                     "beta_slow": 1.0}


def _rope_scaling_args(m: ModelSpec, warnings: list[str]) -> list[str]:
    """Llama-3 RoPE scaling with Megatron-LM's fixed constants -> --use-rope-scaling and its
    factor; linear with an integer factor -> --rotary-seq-len-interpolation-factor; YaRN (below);
    any other scaling (longrope, other constants) -> a warning, never dropped in silence (the run
    would train other rotation frequencies than the config's)."""
    kind, *kv = m.rope_scaling.split()
    vals = {k: float(v) for k, v in (x.split("=", 1) for x in kv)}
    if kind == "llama3" and "factor" in vals and all(
            vals.get(k) == v for k, v in MEGATRON_LLAMA3_ROPE.items()):
        return ["--use-rope-scaling", "--rope-scaling-factor", repr(vals["factor"])]
    if kind == "linear" and set(vals) == {"factor"} and vals["factor"] >= 1 and \
            vals["factor"] == int(vals["factor"]):
        # positions divided by the factor (transformers' linear scaling): megatron-core's
        # RotaryEmbedding seq_len_interpolation_factor (seq *= 1 / factor), an integer argument
        return ["--rotary-seq-len-interpolation-factor", str(int(vals["factor"]))]
    if kind == "yarn" and m.is_mla and "factor" in vals and all(
            vals.get(k, v) == v for k, v in MEGATRON_MLA_YARN.items()):
        # multi-latent attention's YaRN: the factor and both mscales are arguments (their
        # defaults, 1 / 1 / 0, would train another rotation and attention scale); the original
        # length and betas are MLATransformerConfig's fixed defaults, checked equal above
        return ["--rope-type", "yarn", "--rotary-scaling-factor", repr(vals["factor"]),
                "--mscale", repr(vals.get("mscale", 1.0)),
                "--mscale-all-dim", repr(vals.get("mscale_all_dim", 0.0))]
    if kind == "yarn" and not m.is_mla and "factor" in vals and set(vals) <= YARN_KEYS:
        # YaRN on ordinary attention (gpt-oss, Qwen long-context): Megatron-LM's yarn position
        # embedding; its --mscale / --mscale-all-dim defaults (1, 0) give transformers' attention
        # factor 0.1 ln(factor) + 1 when the config states neither
        a = ["--position-embedding-type", "yarn", "--rotary-scaling-factor",
             repr(vals["factor"]), "--yarn-original-max-position-embeddings",
             str(int(vals.get("original_max_position_embeddings", 4096))),
             "--yarn-beta-fast", repr(vals.get("beta_fast", 32.0)),
             "--yarn-beta-slow", repr(vals.get("beta_slow", 1.0))]
        for key in ("mscale", "mscale_all_dim"):
            if key in vals:
                a += [f"--{key.replace('_', '-')}", repr(vals[key])]
        if not vals.get("truncate", 1):  # transformers' truncate: false
            a.append("--no-yarn-correction-range-round-to-int")
        return a
    warnings.append(f"{m.name} uses RoPE scaling ({m.rope_scaling}): not expressed by these "
                    f"Megatron-LM arguments (add it by hand)")
    return []


def _freq(pattern: list[int]) -> str:
    """A per-layer 0/1 list as Megatron-LM's moe_freq_type parses it: "([0]*3+[1]*58)"."""
    runs: list[list[int]] = []
    for x in pattern:
        if runs and runs[-1][0] == x:
            runs[-1][1] += 1
        else:
            runs.append([x, 1])
    return "(" + "+".join(f"[{x}]*{n}" for x, n in runs) + ")"


def windowed(m: ModelSpec) -> bool:
    """Whether some layer attends over a window shorter than the sequence: a window of at least
    seq_len keys is full causal attention (priced so, nest.graph.torch_models.window_scale), and
    exported as such (Phi-3.5-mini's 262144 at 16k tokens): a stated window would make
    Transformer Engine refuse context parallelism's default ring (cp_comm_type p2p)."""
    return bool(m.sliding_window and m.window_layers and m.sliding_window < m.seq_len)


def _window_args(m: ModelSpec, warnings: list[str]) -> list[str]:
    """--window-size (w - 1, 0): a query sees itself and the w - 1 keys before it, as the priced
    band (nest.graph.torch_models.window_scale); the windowed layers as --window-attn-skip-freq
    (Megatron-LM's per-layer list, megatron/core/transformer/utils.is_layer_window_attention:
    1 = a sliding-window layer, 0 = full attention)."""
    size = ["--window-size", f"({m.sliding_window - 1},0)"]
    windowed = [1 if i in m.window_layers else 0 for i in range(m.num_layers)]
    return size if all(windowed) else size + ["--window-attn-skip-freq", _freq(windowed)]
