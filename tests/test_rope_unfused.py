"""Rotary embeddings in eager PyTorch (nest.costs.rope): Megatron-Core's unfused path, its
kernels and bytes counted from the aten calls PyTorch dispatches, against the op the cost model
adds; the setting reaches the cost table only where a run states it."""

import pytest
import torch
from aten_bytes import AtenLog

from nest.costs.rope import (EAGER_FWD_KERNELS, FREQ_BYTES_BWD, FREQ_BYTES_FWD, FUSED_T_BYTES,
                             ROPE_UNFUSED, T_BYTES_BWD, T_BYTES_FWD, rope_unfused_op)
from nest.graph.layer_graph import LayerCost, Op


def _rotate_half(x):
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _megatron_rope(t, freqs, mscale):
    """megatron/core/models/common/embeddings/rope_utils.py _apply_rotary_pos_emb_bshd
    (rotary_interleaved and multi_latent_attention false), core 0.16 / 0.18."""
    rot_dim = freqs.shape[-1]
    t, t_pass = t[..., :rot_dim], t[..., rot_dim:]
    cos_ = (torch.cos(freqs) * mscale).to(t.dtype)
    sin_ = (torch.sin(freqs) * mscale).to(t.dtype)
    t = (t * cos_) + (_rotate_half(t) * sin_)
    return torch.cat((t, t_pass), dim=-1)


@pytest.mark.parametrize("heads", [8, 64])
def test_eager_rope_kernels_and_bytes(heads):
    """Per tensor [s, b, heads, d]: forward 12 kernels, 12 |t| + 48 s d bytes; backward 7
    kernels, 14 |t| + 4 s d bytes (freqs [s, 1, 1, d] FP32)."""
    s, d = 64, 16
    t = torch.randn(s, 1, heads, d, dtype=torch.bfloat16, requires_grad=True)
    freqs = torch.randn(s, 1, 1, d)
    size = t.numel() * t.element_size()
    fwd, bwd = AtenLog(), AtenLog()
    with fwd:
        y = _megatron_rope(t, freqs, 1.3466)
    g = torch.randn_like(y)
    with bwd:
        y.backward(g)
    assert len(fwd.calls) == EAGER_FWD_KERNELS == 12
    assert fwd.nbytes == T_BYTES_FWD * size + FREQ_BYTES_FWD * s * d
    assert len(bwd.calls) == 7, bwd.calls
    assert bwd.nbytes == T_BYTES_BWD * size + FREQ_BYTES_BWD * s * d


def _layer(heads=64, kv=8, d=64, s=4096, b=1):
    nbytes = 2.0 * (2 * b * s * heads * d + 2 * b * s * kv * d)
    att = Op("attention", "attention", 1.0, 2.0, nbytes, 2 * nbytes, (b, heads, s, s, d), 1)
    rope = Op("rope", "memory", 0.0, 0.0, 1.0, 1.0, (), 1)
    return LayerCost((rope, att), (), 0.0, 0.0, {}, {}, 0.0)


def test_op_is_the_eager_path_less_the_fused_kernel_for_q_and_k():
    """gpt-oss's attention (64 heads, 8 K/V heads of 64, s 4096): Q 33.6 MB and K 4.2 MB; the
    op adds (12 - 2) |Q + K| + 48 x 2 s d forward and (14 - 2) |Q + K| + 4 x 2 s d backward."""
    q, k, sd = 2 * 4096 * 64 * 64, 2 * 4096 * 8 * 64, 4096 * 64
    op, = rope_unfused_op(_layer(), True)
    assert op.name == ROPE_UNFUSED and op.kind == "memory" and op.count == 22
    assert op.count * op.fwd_bytes == pytest.approx(
        (T_BYTES_FWD - FUSED_T_BYTES) * (q + k) + 2 * FREQ_BYTES_FWD * sd)
    assert op.count * op.bwd_bytes == pytest.approx(
        (T_BYTES_BWD - FUSED_T_BYTES) * (q + k) + 2 * FREQ_BYTES_BWD * sd)
    assert op.count * op.fwd_bytes == pytest.approx(10 * 37748736 + 96 * 262144)


def test_absent_when_fused_or_without_rotary_embeddings():
    layer = _layer()
    assert rope_unfused_op(layer, False) == ()
    no_rope = LayerCost(tuple(o for o in layer.ops if o.name != "rope"), (), 0.0, 0.0, {}, {},
                        0.0)
    assert rope_unfused_op(no_rope, True) == ()


def test_setting_reaches_the_cost_table_only_where_stated():
    """The default training settings fuse RoPE (every default-run model unchanged); the two
    gpt-oss rows state rope_fusion false (megatron-core 0.16.0rc0 and 0.18.0rc), the Qwen3 rows
    (no YaRN) nothing; a bad value is refused naming the key."""
    from nest.common.errors import SpecError
    from nest.fidelity.published_runs import load_runs, training_for
    from nest.spec.settings import load_training

    assert load_training().rope_fusion is True
    rows = {r["id"]: r for r in load_runs()}
    assert training_for(rows["bridge260401_gpt_oss_120b_64gpu_bf16"]).rope_fusion is False
    assert training_for(rows["bridge2511_gpt_oss_120b_64gpu_bf16"]).rope_fusion is False
    assert training_for(rows["bridge260401_qwen3_30b_a3b_16gpu_fp8"]).rope_fusion is True
    bad = dict(rows["bridge2511_gpt_oss_120b_64gpu_bf16"], rope_fusion="no")
    with pytest.raises(SpecError, match="rope_fusion"):
        training_for(bad)
