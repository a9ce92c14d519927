"""The config.json keys nest.graph.hf_spec understands, per decoder `model_type`.

A key outside these lists may change the architecture (a new norm, a bias, a layer pattern), so a
decoder config that holds one is refused with the file and the key, never planned as if the key
were absent (a Gemma-3 config relabelled `gemma2` keeps `sliding_window_pattern`: refused, not
silently planned without its 5:1 pattern). Each list names keys that are priced (hf_spec reads
them), refused when they would change the model (hf_spec's `refuse`), or have no effect on
training cost: token ids, initialisation, inference caches, routing numerics under the balanced-
routing assumption (nest.graph.torch_models), the checkpoint's storage format.
"""

from __future__ import annotations

from nest.common.errors import SpecError

# no effect on the cost of training (any decoder family)
GENERIC = frozenset("""
_name_or_path architectures model_type transformers_version torch_dtype dtype use_cache
bos_token_id eos_token_id pad_token_id sep_token_id decoder_start_token_id initializer_range
initializer_factor auto_map tokenizer_class id2label label2id return_dict output_hidden_states
output_attentions torchscript use_return_dict is_encoder_decoder is_decoder add_cross_attention
task_specific_params problem_type chunk_size_feed_forward finetuning_task prefix max_length
min_length num_beams do_sample temperature top_k top_p repetition_penalty length_penalty
no_repeat_ngram_size bad_words_ids num_return_sequences early_stopping pruned_heads
tie_encoder_decoder cross_attention_hidden_size tf_legacy_loss use_bfloat16 quantization_config
pretraining_tp cache_implementation
""".split())

# the architecture keys every RoPE decoder family reads (hf_spec._decoder, _seq_len, _rope)
DECODER = frozenset("""
hidden_size num_hidden_layers num_attention_heads num_key_value_heads intermediate_size
vocab_size max_position_embeddings rope_theta rope_scaling rope_parameters partial_rotary_factor
rms_norm_eps layer_norm_eps hidden_act tie_word_embeddings attention_dropout attention_bias
mlp_bias head_dim sliding_window attn_logit_softcapping final_logit_softcapping layer_types
""".split())

MOE_ROUTING = frozenset("""
num_experts_per_tok norm_topk_prob router_aux_loss_coef output_router_logits router_jitter_noise
""".split())

FAMILY_KEYS = {
    "llama": set(),
    "mistral": set(),
    # microsoft/Phi-4-mini's config also carries its original code's full_attn_mod,
    # interpolate_factor and lm_head_bias (Phi3Config never reads them): accepted at the values
    # that leave the model as transformers builds it (hf_spec refuses any other)
    "phi3": {"original_max_position_embeddings", "resid_pdrop", "embd_pdrop", "full_attn_mod",
             "interpolate_factor", "lm_head_bias"},
    "qwen2": {"use_sliding_window", "max_window_layers", "layer_types"},
    "qwen3": {"use_sliding_window", "max_window_layers", "layer_types"},
    "gemma2": {"hidden_activation", "query_pre_attn_scalar", "layer_types",
               "sliding_window_size"},
    "gemma3_text": {"hidden_activation", "query_pre_attn_scalar", "layer_types",
                    "sliding_window_pattern", "rope_local_base_freq",
                    "use_bidirectional_attention"},
    "olmo2": set(),
    "mixtral": MOE_ROUTING | {"num_local_experts"},
    "qwen2_moe": MOE_ROUTING | {"num_experts", "moe_intermediate_size", "decoder_sparse_step",
                                "mlp_only_layers", "shared_expert_intermediate_size", "qkv_bias",
                                "use_sliding_window", "max_window_layers", "layer_types"},
    # transformers >= 5 saves Qwen3MoeConfig's experts as num_local_experts (its attribute_map)
    "qwen3_moe": MOE_ROUTING | {"num_experts", "num_local_experts", "moe_intermediate_size",
                                "decoder_sparse_step", "mlp_only_layers", "use_sliding_window",
                                "max_window_layers", "layer_types"},
    "deepseek_v2": MOE_ROUTING | {
        "n_routed_experts", "n_shared_experts", "moe_intermediate_size", "first_k_dense_replace",
        "moe_layer_freq", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
        "v_head_dim", "topk_method", "scoring_func", "routed_scaling_factor", "n_group",
        "topk_group", "aux_loss_alpha", "seq_aux", "ep_size", "num_nextn_predict_layers",
        # transformers >= 5 writes these too: qk_head_dim = nope + rope (checked in hf_spec),
        # rope_interleave (the rotary's pair order: a permutation, no cost)
        "qk_head_dim", "rope_interleave"},
    "gpt_oss": MOE_ROUTING | {"num_local_experts", "experts_per_token", "layer_types",
                              "swiglu_limit", "swiglu_alpha", "initial_context_length"},
}
FAMILY_KEYS["deepseek_v3"] = FAMILY_KEYS["deepseek_v2"]
FAMILY_KEYS["olmoe"] = MOE_ROUTING | {"num_experts", "clip_qkv"}


def check_keys(cfg: dict, where: str) -> None:
    """SpecError naming the first key of a decoder config that is not understood."""
    mtype = cfg.get("model_type")
    if mtype not in FAMILY_KEYS:
        return  # gpt2 / bert: read by their own key lists in hf_spec
    known = GENERIC | DECODER | FAMILY_KEYS[mtype]
    for key in sorted(cfg):
        # a leading underscore: Transformers' private bookkeeping (_name_or_path,
        # _attn_implementation: the kernel is the run's `attention` setting) or a file's own
        # annotation (_source in config/validation/models); never an architecture key
        if key not in known and cfg[key] is not None and not key.startswith("_"):
            raise SpecError(f"{where}: key '{key}': not understood for model_type '{mtype}' "
                            f"(it may change the architecture, so the config is refused rather "
                            f"than planned without it; remove the key if it does not change the "
                            f"model, or use the model_type it belongs to)")
