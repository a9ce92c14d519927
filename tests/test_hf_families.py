"""Hugging Face families (nest.graph.hf_spec): parameter counts equal transformers' own count on
the meta device, for a tiny config of every family and for the published configs of one model
each; every architecture feature priced or refused by key; the sequence length never defaults to
max_position_embeddings; parallel variants derived from the config."""

import json
import warnings
from pathlib import Path

import pytest

from nest.common.errors import SpecError
from nest.graph import fx_extract as fx
from nest.graph.hf_spec import DEFAULT_SEQ_LEN, model_spec_from_hf_config
from nest.graph.layer_graph import Variant
from nest.graph.torch_models import block_kinds
from nest.spec.catalog import load_model

SMALL_PV = {"tp": [1, 2], "sp": [False], "ep": [1], "cp": [1]}
MOE_PV = {**SMALL_PV, "ep": [1, 2]}
MOE = {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3"}

# ---- published config.json values (no network in tests; each dict names its source) ----------
# https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json
QWEN2_5_7B = {
    "_name_or_path": "Qwen/Qwen2.5-7B", "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
    "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
    "max_position_embeddings": 131072, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
    "hidden_act": "silu", "tie_word_embeddings": False, "use_sliding_window": False,
    "sliding_window": 131072, "max_window_layers": 28, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151643}

# https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json
QWEN3_8B = {
    "_name_or_path": "Qwen/Qwen3-8B", "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
    "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
    "max_position_embeddings": 40960, "rope_theta": 1000000, "rope_scaling": None,
    "rms_norm_eps": 1e-06, "hidden_act": "silu", "tie_word_embeddings": False,
    "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": False,
    "sliding_window": None, "max_window_layers": 36,
    "bos_token_id": 151643, "eos_token_id": 151645}

# https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json
QWEN3_30B_A3B = {
    "_name_or_path": "Qwen/Qwen3-30B-A3B", "model_type": "qwen3_moe",
    "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 6144,
    "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
    "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000.0,
    "rope_scaling": None, "rms_norm_eps": 1e-06, "hidden_act": "silu",
    "tie_word_embeddings": False, "attention_bias": False, "attention_dropout": 0.0,
    "use_sliding_window": False, "sliding_window": None, "max_window_layers": 48,
    "router_aux_loss_coef": 0.001, "bos_token_id": 151643, "eos_token_id": 151645}

# https://huggingface.co/Qwen/Qwen1.5-MoE-A2.7B/blob/main/config.json (model_type qwen2_moe)
QWEN1_5_MOE_A2_7B = {
    "_name_or_path": "Qwen/Qwen1.5-MoE-A2.7B", "model_type": "qwen2_moe",
    "architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 5632,
    "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
    "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
    "num_experts": 60, "num_experts_per_tok": 4, "decoder_sparse_step": 1,
    "norm_topk_prob": False, "vocab_size": 151936, "max_position_embeddings": 8192,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "hidden_act": "silu",
    "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": 32768,
    "max_window_layers": 21, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151643}

# https://huggingface.co/google/gemma-2-9b/blob/main/config.json
GEMMA2_9B = {
    "_name_or_path": "google/gemma-2-9b", "model_type": "gemma2",
    "architectures": ["Gemma2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 14336,
    "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192,
    "sliding_window": 4096, "sliding_window_size": 4096, "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 256, "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "attention_bias": False, "attention_dropout": 0.0, "cache_implementation": "hybrid",
    "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}

# https://huggingface.co/microsoft/Phi-3-mini-4k-instruct/blob/main/config.json
PHI3_MINI_4K = {
    "_name_or_path": "microsoft/Phi-3-mini-4k-instruct", "model_type": "phi3",
    "architectures": ["Phi3ForCausalLM"], "hidden_size": 3072, "intermediate_size": 8192,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
    "vocab_size": 32064, "max_position_embeddings": 4096,
    "original_max_position_embeddings": 4096, "sliding_window": 2047, "rope_scaling": None,
    "rope_theta": 10000.0, "rms_norm_eps": 1e-05, "hidden_act": "silu",
    "tie_word_embeddings": False, "attention_dropout": 0.0, "embd_pdrop": 0.0,
    "resid_pdrop": 0.0, "bos_token_id": 1, "eos_token_id": 32000, "pad_token_id": 32000}

# https://huggingface.co/deepseek-ai/DeepSeek-V2-Lite/blob/main/config.json
DEEPSEEK_V2_LITE = {
    "_name_or_path": "deepseek-ai/DeepSeek-V2-Lite", "model_type": "deepseek_v2",
    "architectures": ["DeepseekV2ForCausalLM"], "hidden_size": 2048, "intermediate_size": 10944,
    "moe_intermediate_size": 1408, "num_hidden_layers": 27, "num_attention_heads": 16,
    "num_key_value_heads": 16, "n_routed_experts": 64, "n_shared_experts": 2,
    "num_experts_per_tok": 6, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "vocab_size": 102400, "max_position_embeddings": 163840,
    "rope_theta": 10000, "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32,
                                          "beta_slow": 1, "mscale": 0.707,
                                          "mscale_all_dim": 0.707,
                                          "original_max_position_embeddings": 4096},
    "topk_method": "greedy", "scoring_func": "softmax", "norm_topk_prob": False,
    "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1, "rms_norm_eps": 1e-06,
    "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 100000, "eos_token_id": 100001}

# https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json
DEEPSEEK_V3 = {
    "_name_or_path": "deepseek-ai/DeepSeek-V3", "model_type": "deepseek_v3",
    "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
    "num_nextn_predict_layers": 1, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_group": 8,
    "topk_group": 4, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
    "norm_topk_prob": True, "routed_scaling_factor": 2.5, "vocab_size": 129280,
    "max_position_embeddings": 163840, "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                     "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096},
    "rms_norm_eps": 1e-06, "hidden_act": "silu", "tie_word_embeddings": False,
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1}

# https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json (tied embeddings, Llama-3
# RoPE scaling)
LLAMA3_2_1B = {
    "_name_or_path": "meta-llama/Llama-3.2-1B", "model_type": "llama",
    "architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rms_norm_eps": 1e-05, "hidden_act": "silu", "tie_word_embeddings": True,
    "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "pretraining_tp": 1,
    "bos_token_id": 128000, "eos_token_id": 128001}

# https://huggingface.co/microsoft/Phi-3-medium-4k-instruct/blob/main/config.json: 40 heads over
# 10 KV heads allow tp 5, which splits no 4096-token sequence (it was refused: "key
# 'parallel_variants.cp': 0 item(s)", a key the user never wrote)
PHI3_MEDIUM_4K = {**PHI3_MINI_4K, "_name_or_path": "microsoft/Phi-3-medium-4k-instruct",
                  "hidden_size": 5120, "intermediate_size": 17920, "num_hidden_layers": 40,
                  "num_attention_heads": 40, "num_key_value_heads": 10, "attention_bias": False}

# https://huggingface.co/mistralai/Mistral-Nemo-Base-2407/blob/main/config.json: head_dim 128,
# not hidden / heads = 160 (Q/K/V/O are 4096 wide in a 5120 model)
MISTRAL_NEMO = {
    "_name_or_path": "mistralai/Mistral-Nemo-Base-2407", "model_type": "mistral",
    "architectures": ["MistralForCausalLM"], "hidden_size": 5120, "intermediate_size": 14336,
    "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 131072, "max_position_embeddings": 128000, "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-05, "hidden_act": "silu", "tie_word_embeddings": False,
    "sliding_window": None, "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2}

# https://huggingface.co/microsoft/phi-4/blob/main/config.json: 40 heads over 10 KV heads
PHI_4 = {
    "_name_or_path": "microsoft/phi-4", "model_type": "phi3", "architectures": ["Phi3ForCausalLM"],
    "hidden_size": 5120, "intermediate_size": 17920, "num_hidden_layers": 40,
    "num_attention_heads": 40, "num_key_value_heads": 10, "vocab_size": 100352,
    "max_position_embeddings": 16384, "original_max_position_embeddings": 16384,
    "rope_theta": 250000, "rope_scaling": None, "rms_norm_eps": 1e-05, "hidden_act": "silu",
    "tie_word_embeddings": False, "sliding_window": None, "attention_bias": False,
    "attention_dropout": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0, "bos_token_id": 100257,
    "eos_token_id": 100265, "pad_token_id": 100349}

# https://huggingface.co/allenai/OLMoE-1B-7B-0924/blob/main/config.json (6.92 B parameters)
OLMOE_1B_7B = {
    "_name_or_path": "allenai/OLMoE-1B-7B-0924", "model_type": "olmoe",
    "architectures": ["OlmoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 1024,
    "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16,
    "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": False, "vocab_size": 50304,
    "max_position_embeddings": 4096, "rope_theta": 10000.0, "rope_scaling": None,
    "rms_norm_eps": 1e-05, "hidden_act": "silu", "tie_word_embeddings": False,
    "attention_bias": False, "attention_dropout": 0.0, "clip_qkv": None,
    "output_router_logits": False, "router_aux_loss_coef": 0.01, "pad_token_id": 1,
    "eos_token_id": 50279, "initializer_range": 0.02, "use_cache": True}

# https://huggingface.co/microsoft/Phi-4-mini-instruct/blob/main/config.json (RoPE on 3/4 of
# each head, tied embeddings, its original code's full_attn_mod / interpolate_factor /
# lm_head_bias; rope_scaling's 48-entry factor lists shortened: no cost, not counted)
PHI_4_MINI = {
    "_name_or_path": "microsoft/Phi-4-mini-instruct", "model_type": "phi3",
    "architectures": ["Phi3ForCausalLM"], "hidden_size": 3072, "intermediate_size": 8192,
    "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8,
    "vocab_size": 200064, "max_position_embeddings": 131072,
    "original_max_position_embeddings": 4096, "partial_rotary_factor": 0.75,
    "rope_scaling": {"long_factor": [1.0] * 48, "short_factor": [1.0] * 48, "type": "longrope"},
    "rope_theta": 10000.0, "rms_norm_eps": 1e-05, "hidden_act": "silu",
    "tie_word_embeddings": True, "attention_bias": False, "attention_dropout": 0.0,
    "embd_pdrop": 0.0, "resid_pdrop": 0.0, "mlp_bias": False, "sliding_window": 262144,
    "full_attn_mod": 1, "interpolate_factor": 1, "lm_head_bias": False,
    "bos_token_id": 199999, "eos_token_id": 199999, "pad_token_id": 199999}

FULL_SIZE = {"olmoe_1b_7b": OLMOE_1B_7B, "phi_4_mini": PHI_4_MINI, "mistral_nemo": MISTRAL_NEMO, "phi_4": PHI_4, "phi_3_medium_4k": PHI3_MEDIUM_4K, "llama3_2_1b": LLAMA3_2_1B, "qwen2_5_7b": QWEN2_5_7B, "qwen3_8b": QWEN3_8B, "qwen3_30b_a3b": QWEN3_30B_A3B,
             "qwen1_5_moe_a2_7b": QWEN1_5_MOE_A2_7B, "gemma_2_9b": GEMMA2_9B,
             "phi_3_mini_4k": PHI3_MINI_4K, "deepseek_v2_lite": DEEPSEEK_V2_LITE,
             "deepseek_v3": DEEPSEEK_V3}


# ---- tiny configs of each family (hidden 64: transformers builds them in milliseconds) --------
_BASE = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=1000, max_position_embeddings=512,
             tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
_MLA = dict(num_key_value_heads=4, num_experts_per_tok=2, moe_intermediate_size=32,
            first_k_dense_replace=1, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
            v_head_dim=16)
TINY = {
    "llama": dict(_BASE, model_type="llama"),
    "mistral": dict(_BASE, model_type="mistral", sliding_window=64),
    "mixtral": dict(_BASE, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2),
    "qwen2": dict(_BASE, model_type="qwen2"),
    "qwen3": dict(_BASE, model_type="qwen3", head_dim=32),
    "qwen2_moe": dict(_BASE, model_type="qwen2_moe", num_experts=6, num_experts_per_tok=4,
                      moe_intermediate_size=32, shared_expert_intermediate_size=64),
    "qwen3_moe": dict(_BASE, model_type="qwen3_moe", head_dim=32, num_experts=8,
                      num_experts_per_tok=2, moe_intermediate_size=32),
    "gemma2": dict(_BASE, model_type="gemma2", head_dim=32, tie_word_embeddings=True,
                   sliding_window=64, attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
    "phi3": dict(_BASE, model_type="phi3", sliding_window=64),
    "deepseek_v2": dict(_BASE, **_MLA, model_type="deepseek_v2", n_routed_experts=8,
                        n_shared_experts=2, q_lora_rank=None),
    "deepseek_v3": dict(_BASE, **_MLA, model_type="deepseek_v3", n_routed_experts=8,
                        n_shared_experts=1, q_lora_rank=24, n_group=2, topk_group=1),
    "gemma3_text": dict(_BASE, model_type="gemma3_text", head_dim=32, tie_word_embeddings=True,
                        num_hidden_layers=6, sliding_window=32, sliding_window_pattern=3),
    "olmo2": dict(_BASE, model_type="olmo2"),
    "gpt_oss": dict(_BASE, model_type="gpt_oss", head_dim=32, num_local_experts=4,
                    num_experts_per_tok=2, sliding_window=32, attention_bias=True),
    "olmoe": dict(_BASE, model_type="olmoe", num_experts=8, num_experts_per_tok=2),
}
MOE |= {"gpt_oss", "olmoe"}


def hf_num_params(cfg: dict) -> int:
    """transformers' own model built from the config on the meta device."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    kw = {k: v for k, v in cfg.items() if not k.startswith("_") and k != "model_type"}
    hf_cfg = transformers.AutoConfig.for_model(cfg["model_type"], **kw)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("family", sorted(TINY))
def test_tiny_family_params_equal_transformers_and_graph_builds(family):
    spec = model_spec_from_hf_config(TINY[family], seq_len=128,
                                     parallel_variants=MOE_PV if family in MOE else SMALL_PV)
    assert fx.total_params(spec) == hf_num_params(TINY[family])
    g = fx.build_layer_graph_fx(spec)
    assert g.num_params == fx.total_params(spec)
    for v in g.variants:  # every layer of every variant priced; sharded params add up
        assert all(v.key in la.costs for la in g.layers)


@pytest.mark.parametrize("name", sorted(FULL_SIZE))
def test_published_config_params_equal_transformers(name):
    """Within 0.1% of transformers' meta-device count (they are equal). DeepSeek-V3's MTP module
    is not in transformers' model: compared without it (with it: the MTP test below)."""
    spec = model_spec_from_hf_config({**FULL_SIZE[name], "num_nextn_predict_layers": None},
                                     seq_len=4096)
    ref = hf_num_params(FULL_SIZE[name])
    assert fx.total_params(spec) == pytest.approx(ref, rel=1e-3)
    assert fx.total_params(spec) == ref


# ---- sequence length ----------------------------------------------------------------------------


def test_seq_len_never_defaults_to_max_position_embeddings(tmp_path):
    with pytest.warns(UserWarning, match="no training sequence length"):
        spec = model_spec_from_hf_config(QWEN3_8B)
    assert spec.seq_len == DEFAULT_SEQ_LEN != QWEN3_8B["max_position_embeddings"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3_8B))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_model(path, seq_len=2048).seq_len == 2048
    assert load_model("tiny_llama", seq_len=128).seq_len == 128  # a catalog model too


def test_cli_seq_len(tmp_path):
    from nest.interfaces.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY["qwen3"]))
    g = tmp_path / "g.json"
    assert main(["graph", "--model", str(path), "--seq-len", "64", "-o", str(g)]) == 0
    assert json.loads(g.read_text())["seq_len"] == 64


# ---- parallel variants derived from the config ------------------------------------------------


def test_parallel_variants_derived():
    pv = model_spec_from_hf_config(QWEN2_5_7B, seq_len=4096).parallel_variants
    assert pv.tp == (1, 2, 4)  # 28 heads, 4 KV heads
    assert pv.sp == (False, True) and pv.ep == (1,) and pv.cp == (1, 2, 4, 8)
    pv = model_spec_from_hf_config(DEEPSEEK_V2_LITE, seq_len=4096).parallel_variants
    assert pv.tp == (1, 2, 4, 8) and pv.ep == (1, 2, 4, 8, 16, 32, 64)
    pv = model_spec_from_hf_config(QWEN3_30B_A3B, seq_len=1000).parallel_variants
    assert pv.cp == (1, 2)  # 1000 = 2 x 4 x 125: cp x tp(sp) must divide it


# ---- features priced ----------------------------------------------------------------------------


def test_sliding_window_prices_the_band():
    """Gemma-2: even blocks attend over 64 of 256 tokens: w^2/2 + (s-w) w scores instead of
    s^2/2, and the saved scores shrink to the s x w band."""
    spec = model_spec_from_hf_config(TINY["gemma2"], seq_len=256, parallel_variants=SMALL_PV)
    assert block_kinds(spec) == ["block:window", "block", "block:window", "block"]
    full = fx.trace_layer(spec, "block").cost
    win = fx.trace_layer(spec, "block:window").cost
    att_full, att_win = (next(o for o in c.ops if o.kind == "attention") for c in (full, win))
    s, w = 256, 64
    assert att_win.fwd_flops / att_full.fwd_flops == pytest.approx(
        (w * w / 2 + (s - w) * w) / (s * s / 2))
    assert win.act_bytes["none"] < full.act_bytes["none"]
    assert win.act_bytes["selective"] == full.act_bytes["selective"]  # scores not kept


def test_gemma2_published_window_repeat_accepted_only_when_equal():
    """google/gemma-2-9b's config.json states the window twice (`sliding_window` and
    `sliding_window_size`, 4096 both); the published file plans with the window on the even
    blocks, and a repeat that disagrees is refused by name rather than one of them dropped."""
    spec = model_spec_from_hf_config(GEMMA2_9B, seq_len=8192)
    assert spec.sliding_window == 4096 and list(spec.window_layers) == list(range(0, 42, 2))
    with pytest.raises(SpecError, match="key 'sliding_window_size': 2048"):
        model_spec_from_hf_config({**GEMMA2_9B, "sliding_window_size": 2048}, seq_len=8192)
    with pytest.raises(SpecError, match="key 'sliding_window_size'"):
        model_spec_from_hf_config({**QWEN3_8B, "sliding_window_size": 4096}, seq_len=4096)


def test_rope_scaling_reaches_the_export():
    """RoPE scaling changes no cost but does change the trained model: Llama-3.2-1B's llama3
    scaling (Megatron-LM's fixed constants 1 / 4 / 8192) exports as --use-rope-scaling with the
    config's factor 32; DeepSeek-V2-Lite's yarn under multi-latent attention as --rope-type yarn
    with its factor and mscales; a scaling Megatron-LM cannot state (llama3 with other constants,
    an MLA yarn with another original length) is a warning naming it, never dropped in silence;
    a config without scaling exports neither."""
    from nest.interfaces.export_model import model_args

    warn: list[str] = []
    args = model_args(model_spec_from_hf_config(LLAMA3_2_1B, seq_len=4096), warn)
    i = args.index("--rope-scaling-factor")
    assert "--use-rope-scaling" in args and float(args[i + 1]) == 32.0 and not warn
    other = {**LLAMA3_2_1B["rope_scaling"], "original_max_position_embeddings": 4096}
    args = model_args(model_spec_from_hf_config({**LLAMA3_2_1B, "rope_scaling": other},
                                                seq_len=4096), warn)
    assert "--use-rope-scaling" not in args and "RoPE scaling (llama3" in warn.pop()
    args = model_args(model_spec_from_hf_config(DEEPSEEK_V2_LITE, seq_len=4096), warn)
    assert "--use-rope-scaling" not in args and not warn
    assert args[args.index("--rotary-scaling-factor") + 1] == "40.0"
    assert args[args.index("--rope-type") + 1] == "yarn"
    longer = {**DEEPSEEK_V2_LITE["rope_scaling"], "original_max_position_embeddings": 8192}
    args = model_args(model_spec_from_hf_config({**DEEPSEEK_V2_LITE, "rope_scaling": longer},
                                                seq_len=4096), warn)
    assert "--rope-type" not in args
    assert any("RoPE scaling (yarn" in w and "factor=40" in w for w in warn)
    warn.clear()
    args = model_args(model_spec_from_hf_config(QWEN3_8B, seq_len=4096), warn)
    assert "--use-rope-scaling" not in args and not any("RoPE" in w for w in warn)


def test_gemma_numerics_megatron_cannot_state_are_export_warnings():
    """Gemma-2 scales the embeddings by sqrt(h), applies RMSNorm as 1 + w and (27B) scales the
    scores by query_pre_attn_scalar ** -0.5 = 1/sqrt(144), not head_dim ** -0.5 = 1/sqrt(128)
    (transformers' Gemma2Attention.scaling): none costs anything, none has a Megatron-LM argument
    (softmax_scale is not one), so the export names each instead of dropping it."""
    from nest.interfaces.export_model import model_args

    gemma2_27b = {**GEMMA2_9B, "_name_or_path": "google/gemma-2-27b", "hidden_size": 4608,
                  "intermediate_size": 36864, "num_hidden_layers": 46,
                  "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128,
                  "query_pre_attn_scalar": 144}
    assert gemma2_27b["hidden_size"] // gemma2_27b["num_attention_heads"] == 144
    for cfg, scale in ((GEMMA2_9B, False), (gemma2_27b, True)):
        warn: list[str] = []
        model_args(model_spec_from_hf_config(cfg, seq_len=4096), warn)
        text = " ".join(warn)
        assert "sqrt(hidden_size)" in text and "1 + w" in text
        assert ("softmax scale 1/sqrt(144)" in text) is scale
    warn = []
    model_args(model_spec_from_hf_config(QWEN3_8B, seq_len=4096), warn)
    assert not warn


def test_phi3_and_mistral_window_every_block():
    for fam in ("phi3", "mistral"):
        spec = model_spec_from_hf_config(TINY[fam], seq_len=128)
        assert set(block_kinds(spec)) == {"block:window"}
        assert set(block_kinds(model_spec_from_hf_config(TINY[fam], seq_len=64))) == {"block"}


def test_deepseek_dense_first_blocks_and_mla_flops():
    spec = model_spec_from_hf_config(TINY["deepseek_v2"], seq_len=128, parallel_variants=MOE_PV)
    assert block_kinds(spec) == ["block:dense", "block", "block", "block"]
    g = fx.build_layer_graph_fx(spec)
    assert g.layers[1].costs["tp1_sp0_ep1_cp1"] is not g.layers[2].costs["tp1_sp0_ep1_cp1"]
    cost = fx.trace_layer(spec, "block").cost
    att = next(o for o in cost.ops if o.kind == "attention")
    b, a, s, dq, dv = 1, 4, 128, 16 + 8, 16
    assert att.fwd_flops == pytest.approx(2 * b * a * s * s * (dq + dv) * 0.5)  # causal half
    # the MoE block's experts are expert parameters; its shared experts are dense
    assert cost.expert_params == 8 * 3 * 64 * 32


def test_softcap_priced_on_the_logits():
    spec = model_spec_from_hf_config(TINY["gemma2"], seq_len=128)
    head = fx.trace_layer(spec, "head").cost
    assert "logit_softcap" in {o.name for o in head.ops}
    nocap = model_spec_from_hf_config({**TINY["gemma2"], "final_logit_softcapping": None},
                                      seq_len=128)
    assert head.act_bytes["none"] > fx.trace_layer(nocap, "head").cost.act_bytes["none"]


def test_rope_scaling_accepted_unknown_refused():
    model_spec_from_hf_config({**TINY["llama"], "rope_scaling": {"rope_type": "llama3",
                                                                 "factor": 8.0}}, seq_len=64)
    with pytest.raises(SpecError, match="rope_scaling.rope_type"):
        model_spec_from_hf_config({**TINY["llama"], "rope_scaling": {"rope_type": "fancy"}},
                                  seq_len=64)


# ---- features refused by key --------------------------------------------------------------------


@pytest.mark.parametrize("family,extra,key", [
    ("llama", {"attention_bias": True}, "attention_bias"),
    ("llama", {"mlp_bias": True}, "mlp_bias"),
    ("phi3", {"resid_pdrop": 0.1}, "resid_pdrop"),
    ("qwen2", {"attn_logit_softcapping": 30.0}, "attn_logit_softcapping"),
    ("qwen3_moe", {"mlp_only_layers": [0]}, "mlp_only_layers"),
    ("qwen3_moe", {"decoder_sparse_step": 2}, "decoder_sparse_step"),
    ("deepseek_v2", {"moe_layer_freq": 2}, "moe_layer_freq"),
    ("llama", {"hidden_act": "relu"}, "hidden_act"),
    ("llama", {"model_type": "falcon"}, "model_type"),
])
def test_unpriced_feature_is_an_error_naming_the_key(family, extra, key):
    with pytest.raises(SpecError, match=f"key '{key}'"):
        model_spec_from_hf_config({**TINY[family], **extra}, seq_len=64)


@pytest.mark.parametrize("family, extra, key", [
    ("qwen2", {"num_key_value_heads": 3}, "num_key_value_heads"),
    ("mixtral", {"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ("qwen3_moe", {"num_experts_per_tok": 99}, "num_experts_per_tok"),
])
def test_inconsistent_shapes_name_the_configs_own_key(family, extra, key):
    """A config whose KV heads do not divide its heads, or that routes to more experts than it
    has, is refused naming the config.json key (it named the ModelSpec's num_kv_heads / top_k,
    which a user does not find in the file)."""
    with pytest.raises(SpecError, match=f"key '{key}'"):
        model_spec_from_hf_config({**TINY[family], **extra}, seq_len=64)


def test_closed_form_refuses_what_it_does_not_model():
    from nest.graph import closed_form as cf

    spec = model_spec_from_hf_config(TINY["qwen3"], seq_len=64)
    with pytest.raises(SpecError, match="qk_norm"):
        cf.build_layer_graph(spec)


def test_unbalanced_expert_count_is_padded():
    """60 experts x top-4 over 128 tokens is not a whole number per expert: capacity rounds up."""
    spec = model_spec_from_hf_config({**TINY["qwen2_moe"], "num_experts": 60}, seq_len=128,
                                     parallel_variants={"ep": [1, 4]})
    cost = fx.trace_layer(spec, "block", Variant(ep=4)).cost
    up = next(o for o in cost.ops if o.name == "expert_gate_up")
    assert up.count == 15 and up.shape[0] == 4 * -(-128 * 4 // 60)


# ---- current families (issue 25): published configs in tests/fixtures/hf/ ------------------------

FIXTURES = Path(__file__).parent / "fixtures" / "hf"


@pytest.mark.parametrize("name", ["gemma_3_1b_pt", "olmo_2_1124_7b", "gpt_oss_20b",
                                  "mixtral_8x22b", "qwen1_5_moe_a2_7b", "llama_3_70b"])
def test_fixture_params_equal_transformers(name):
    path = FIXTURES / f"{name}.json"
    cfg = json.loads(path.read_text())
    spec = model_spec_from_hf_config(path, seq_len=4096)
    ref = hf_num_params({k: v for k, v in cfg.items() if k != "quantization_config"})
    assert fx.total_params(spec) == ref


def test_published_counts_of_the_new_families():
    """Model cards: Gemma 3 1B 999,885,952 (the safetensors index), gpt-oss-20b 20.91 B
    ("21B parameters"), OLMo-2-7B 7.30 B."""
    count = {n: fx.total_params(model_spec_from_hf_config(FIXTURES / f"{n}.json", seq_len=4096))
             for n in ("gemma_3_1b_pt", "gpt_oss_20b", "olmo_2_1124_7b")}
    assert count["gemma_3_1b_pt"] == 999_885_952
    assert count["gpt_oss_20b"] == pytest.approx(20.91e9, rel=1e-3)
    assert count["olmo_2_1124_7b"] == pytest.approx(7.30e9, rel=1e-3)


def test_deepseek_v3_mtp_priced_on_top_of_transformers_count():
    """transformers' DeepseekV3ForCausalLM has no MTP module; ours adds one MoE block, the 2h x h
    projection and three RMSNorms (enorm, hnorm, its final norm) in the head layer. The card's
    685 B = 671 B main model + 14 B MTP (its 14 B also holds copies of the embedding and head)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = FIXTURES / "deepseek_v3.json"
    spec = model_spec_from_hf_config(path, seq_len=4096)
    assert spec.mtp_layers == 1 and spec.num_dense_layers == 3 and spec.kv_lora_rank == 512
    cfg = {k: v for k, v in json.loads(path.read_text()).items()
           if k not in ("quantization_config", "auto_map")}
    kw = {k: v for k, v in cfg.items() if not k.startswith("_") and k != "model_type"}
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model("deepseek_v3", **kw))
    main = sum(p.numel() for p in model.parameters())
    moe_block = sum(p.numel() for p in model.model.layers[3].parameters())
    h = 7168
    assert fx.total_params(spec) == main + moe_block + 2 * h * h + 3 * h
    assert main == pytest.approx(671e9, rel=2e-3)
    head = fx.trace_layer(spec, "head", Variant(tp=8, sp=True, ep=8)).cost
    assert "mtp_eh_proj" in {o.name for o in head.ops} and head.expert_params > 0
    assert any(c.group == "ep" for c in head.collectives)  # the MTP block's all-to-alls


def test_gemma3_five_local_one_global_priced():
    spec = model_spec_from_hf_config(FIXTURES / "gemma_3_1b_pt.json", seq_len=4096)
    kinds = block_kinds(spec)
    assert kinds[:6] == ["block:window"] * 5 + ["block"] and kinds.count("block") == 4
    assert spec.qk_norm and spec.sandwich_norm and spec.ffn_type == "geglu"


def test_gemma3_relabelled_gemma2_is_refused():
    cfg = {**json.loads((FIXTURES / "gemma_3_1b_pt.json").read_text()), "model_type": "gemma2"}
    with pytest.raises(SpecError, match="key 'rope_local_base_freq': not understood"):
        model_spec_from_hf_config(cfg, seq_len=4096)


@pytest.mark.parametrize("key", ["clip_qkv", "use_parallel_residual", "new_norm_type"])
def test_unknown_architecture_key_refused(key):
    with pytest.raises(SpecError, match=f"key '{key}': not understood for model_type 'llama'"):
        model_spec_from_hf_config({**TINY["llama"], key: 1}, seq_len=64)


def test_gpt_oss_sinks_biases_and_alternating_window():
    spec = model_spec_from_hf_config(FIXTURES / "gpt_oss_20b.json", seq_len=4096)
    assert spec.linear_bias and spec.attention_sinks and spec.num_experts == 32
    assert block_kinds(spec)[:4] == ["block:window", "block", "block:window", "block"]
    tiny = model_spec_from_hf_config(TINY["gpt_oss"], seq_len=128, parallel_variants=MOE_PV)
    mod_params = dict(fx.tm.build_layer(tiny, "block")[0].named_parameters())
    assert mod_params["attention.sinks"].numel() == 4  # one sink per head
    assert mod_params["mlp.experts_gate_up.bias"].shape == (4, 1, 2 * 128)


def test_olmoe_is_read():
    """OLMoE (Muennighoff et al. 2024; transformers' OlmoeDecoderLayer): a Llama block with
    RMSNorm over the whole Q and K projections (OLMo-2's q_norm / k_norm) but norms before
    attention and MLP, 64 experts of width intermediate_size, top 8 of a softmax over every
    expert not renormalised (norm_topk_prob false: --moe-router-pre-softmax), aux loss 0.01.
    It was refused ("model_type 'olmoe' is not supported"); QKV clipping stays refused."""
    spec = model_spec_from_hf_config(OLMOE_1B_7B, seq_len=4096)
    assert spec.family == "mixtral" and spec.pre_norm and spec.qk_norm and spec.qk_norm_full
    assert (spec.num_experts, spec.top_k, spec.ffn_hidden_size) == (64, 8, 1024)
    assert spec.router == "pre_softmax"
    assert (spec.balance_loss, spec.aux_loss_coeff) == ("aux_loss", 0.01)
    assert spec.parallel_variants.ep == (1, 2, 4, 8, 16, 32, 64)
    assert fx.total_params(spec) == 6_919_161_856  # the 6.92 B of its model card
    with pytest.raises(SpecError, match="key 'clip_qkv'"):
        model_spec_from_hf_config({**OLMOE_1B_7B, "clip_qkv": 8.0}, seq_len=4096)


def test_olmo2_post_norms_and_full_qk_norm():
    spec = model_spec_from_hf_config(TINY["olmo2"], seq_len=128, parallel_variants=SMALL_PV)
    assert not spec.pre_norm and spec.qk_norm_full
    names = {o.name for o in fx.trace_layer(spec, "block").cost.ops}
    assert {"post_norm1", "post_norm2", "qk_norm"} <= names and "norm1" not in names
    tp2 = fx.trace_layer(spec, "block", Variant(tp=2)).cost
    # the whole-projection norm's statistic all-reduced over tp, per token (fp32), Q and K
    stats = [c for c in tp2.collectives if c.bytes == 4 * 128]
    assert sum(c.count for c in stats) == 4


def test_gemma3_image_text_config_plans_its_text_decoder_with_a_warning():
    text = {k: v for k, v in TINY["gemma3_text"].items() if k != "model_type"}
    wrapped = {"model_type": "gemma3", "text_config": {**text, "model_type": "gemma3_text"},
               "vision_config": {"model_type": "siglip_vision_model"}}
    with pytest.warns(UserWarning, match="vision tower"):
        spec = model_spec_from_hf_config(wrapped, seq_len=128)
    assert fx.total_params(spec) == hf_num_params(TINY["gemma3_text"])


def test_derived_tp_divides_the_sequence():
    """Phi-3-medium (40 heads, 10 KV heads): tp 5 divides every width but not a 4096-token
    sequence, which sequence parallelism splits over tp; tp 1 / 2 remain, and every cp."""
    from nest.graph.hf_spec import derive_variants

    spec = model_spec_from_hf_config(PHI3_MEDIUM_4K, seq_len=4096)
    pv = spec.parallel_variants
    assert pv.tp == (1, 2) and pv.cp == (1, 2, 4, 8)
    assert derive_variants({"num_heads": 40, "num_kv_heads": 10, "ffn_hidden_size": 17920,
                            "seq_len": 4000})["tp"] == [1, 2, 5]  # 4000 = 5 x 800


def test_gemma3_27b_published_text_config_takes_transformers_defaults():
    """google/gemma-3-27b-pt's config.json: its text_config states no vocab_size, rope_theta,
    rms_norm_eps or max_position_embeddings (Gemma3TextConfig's defaults apply). It was refused
    ("key 'vocab_size': required"); now its count is transformers' Gemma3ForCausalLM's and the
    62 blocks are 5 windowed (1024) to 1 global."""
    text = {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
            "model_type": "gemma3_text", "num_attention_heads": 32, "num_hidden_layers": 62,
            "num_key_value_heads": 16, "query_pre_attn_scalar": 168,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024}
    cfg = {"architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
           "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
           "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
           "text_config": text, "torch_dtype": "bfloat16",
           "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152}}
    with pytest.warns(UserWarning, match="vision tower"):
        spec = model_spec_from_hf_config(cfg, seq_len=4096)
    assert fx.total_params(spec) == hf_num_params(text)
    assert spec.vocab_size == 262208 and spec.rope_theta == 1e6 and spec.sliding_window == 1024
    assert spec.window_layers == tuple(i for i in range(62) if (i + 1) % 6)
    assert spec.rope_scaling == "linear factor=8.0"


def test_gemma3_4b_published_text_config_takes_the_default_heads():
    """google/gemma-3-4b-pt's text_config states no num_attention_heads / num_key_value_heads
    (its 8 / 4 are Gemma3TextConfig's defaults). It was refused ("key 'num_attention_heads':
    required"); now its count is transformers' Gemma3ForCausalLM's (3,880,263,168; Keras-Hub's
    gemma3_4b_text preset lists 3,880,099,328 = that less 64 x 2560 for its 262,144-token
    vocabulary)."""
    text = {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
            "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024}
    cfg = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
           "text_config": text, "torch_dtype": "bfloat16",
           "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152}}
    with pytest.warns(UserWarning, match="vision tower"):
        spec = model_spec_from_hf_config(cfg, seq_len=4096)
    assert spec.num_heads == 8 and spec.num_kv_heads == 4 and spec.head_dim == 256
    assert fx.total_params(spec) == hf_num_params(text) == 3_880_263_168


def test_transformers5_rope_parameters_give_the_rope_base():
    """transformers >= 5 saves the RoPE base inside `rope_parameters` and no top-level rope_theta
    (LlamaConfig(...).to_json_string() on 5.24; Gemma-3 per layer type). The export said
    --rotary-base 10000 for such a Llama-3.1 and dropped Gemma-3's linear scaling in silence."""
    from nest.interfaces.export_model import model_args

    llama = {**TINY["llama"], "rope_parameters": {
        "factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192, "rope_theta": 500000.0, "rope_type": "llama3"}}
    spec = model_spec_from_hf_config(llama, seq_len=128)
    assert spec.rope_theta == 500000.0
    args = model_args(spec, [])
    assert args[args.index("--rotary-base") + 1] == "500000"
    assert args[args.index("--rope-scaling-factor") + 1] == "8.0"
    gemma = {**TINY["gemma3_text"], "rope_parameters": {
        "full_attention": {"factor": 8.0, "rope_theta": 1000000.0, "rope_type": "linear"},
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}}
    spec = model_spec_from_hf_config(gemma, seq_len=128)
    assert spec.rope_theta == 1e6 and spec.rope_scaling == "linear factor=8.0"


def test_linear_rope_and_gemma3_local_base_reach_the_export():
    """Linear RoPE scaling (positions divided by the factor) is Megatron-LM's
    --rotary-seq-len-interpolation-factor (an integer; megatron-core RotaryEmbedding: seq *= 1 /
    factor, transformers' linear scaling): exported for a Llama, a warning where the factor is
    fractional. Gemma-3 scales only its global layers and runs its windowed layers at another
    base (rope_local_base_freq, 10000): Megatron's one rotary base and factor cannot state that,
    so it is a warning naming both, not the global base on every layer in silence (the warning
    had also suggested multi-latent attention's YaRN flags)."""
    from nest.interfaces.export_model import model_args

    warn: list[str] = []
    lin = {**TINY["llama"], "rope_scaling": {"rope_type": "linear", "factor": 4.0}}
    args = model_args(model_spec_from_hf_config(lin, seq_len=128), warn)
    assert args[args.index("--rotary-seq-len-interpolation-factor") + 1] == "4" and not warn
    frac = {**TINY["llama"], "rope_scaling": {"rope_type": "linear", "factor": 2.5}}
    args = model_args(model_spec_from_hf_config(frac, seq_len=128), warn)
    assert "--rotary-seq-len-interpolation-factor" not in args
    assert "linear factor=2.5" in warn.pop() and not warn
    zero = {**TINY["llama"], "rope_scaling": {"rope_type": "linear", "factor": 0}}
    args = model_args(model_spec_from_hf_config(zero, seq_len=128), warn)
    assert "--rotary-seq-len-interpolation-factor" not in args and "factor=0" in warn.pop()
    gemma = {**TINY["gemma3_text"], "rope_theta": 1e6, "rope_local_base_freq": 10000.0,
             "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    args = model_args(model_spec_from_hf_config(gemma, seq_len=128), warn)
    assert "--rotary-seq-len-interpolation-factor" not in args
    text = " ".join(warn)
    assert "global" in text and "rope_local_base_freq 10000" in text and "multi-latent" not in text
    warn.clear()
    same = {**TINY["gemma3_text"], "rope_theta": 10000.0, "rope_local_base_freq": 10000.0}
    model_args(model_spec_from_hf_config(same, seq_len=128), warn)
    assert not any("rope_local_base_freq" in w for w in warn)


def test_transformers5_saved_moe_configs_plan():
    """Configs written by transformers >= 5 (to_json_string on 5.24): Qwen3MoeConfig saves its
    experts as num_local_experts (attribute_map) and no num_experts; DeepseekV3Config adds
    qk_head_dim (= nope + rope), head_dim (= the rotary part) and rope_interleave. Both were
    refused ("not understood"); the counts equal transformers', and a qk_head_dim that is not
    nope + rope, or a num_local_experts that contradicts num_experts, is refused by name."""
    q = {k: v for k, v in TINY["qwen3_moe"].items() if k != "num_experts"}
    q["num_local_experts"] = TINY["qwen3_moe"]["num_experts"]
    spec = model_spec_from_hf_config(q, seq_len=128, parallel_variants=MOE_PV)
    assert spec.num_experts == q["num_local_experts"]
    assert fx.total_params(spec) == hf_num_params(TINY["qwen3_moe"])
    with pytest.raises(SpecError, match="key 'num_local_experts'"):
        model_spec_from_hf_config({**TINY["qwen3_moe"], "num_local_experts": 3}, seq_len=128)
    base = {**TINY["deepseek_v3"], "num_nextn_predict_layers": None}
    nope, rope = base["qk_nope_head_dim"], base["qk_rope_head_dim"]
    d = {**base, "qk_head_dim": nope + rope, "head_dim": rope, "rope_interleave": True}
    spec = model_spec_from_hf_config(d, seq_len=128, parallel_variants=MOE_PV)
    assert fx.total_params(spec) == hf_num_params(base)
    with pytest.raises(SpecError, match="key 'qk_head_dim'"):
        model_spec_from_hf_config({**d, "qk_head_dim": nope}, seq_len=128)


def test_partial_rotary_is_exported_and_phi4_minis_legacy_keys_read(tmp_path):
    """partial_rotary_factor (Phi-4-mini: RoPE on 3/4 of each head) costs nothing but changes
    the model: carried as rotary_percent and exported as Megatron-LM's --rotary-percent (it was
    accepted and dropped, so the export trained RoPE over whole heads). Phi-4-mini's
    full_attn_mod / interpolate_factor / lm_head_bias are read at their no-op values only."""
    from nest.interfaces.export_model import model_args

    path = tmp_path / "config.json"
    path.write_text(json.dumps(PHI_4_MINI))
    spec = model_spec_from_hf_config(path, seq_len=4096)
    assert spec.rotary_percent == 0.75
    a = model_args(spec, [])
    assert a[a.index("--rotary-percent") + 1] == "0.75"
    assert "--rotary-percent" not in model_args(
        model_spec_from_hf_config(FIXTURES / "llama_3_70b.json", seq_len=4096), [])
    for key, value in (("full_attn_mod", 2), ("interpolate_factor", 4), ("lm_head_bias", True)):
        path.write_text(json.dumps({**PHI_4_MINI, key: value}))
        with pytest.raises(SpecError, match=key):
            model_spec_from_hf_config(path, seq_len=4096)
    path.write_text(json.dumps({**PHI_4_MINI, "partial_rotary_factor": None,
                                "rope_parameters": {"rope_type": "default",
                                                    "partial_rotary_factor": "half"}}))
    with pytest.raises(SpecError, match="partial_rotary_factor"):
        model_spec_from_hf_config(path, seq_len=4096)
