"""Every micro-batch's layer graph from one trace at a tagged batch (nest.graph.fx_batch) equals,
field for field, the graph traced at that micro-batch: dense, MoE, multi-latent attention and
sliding-window models, micro-batch 1 to 4, at the corners of their parallel variants."""

from __future__ import annotations

import pytest

from nest.graph import fx_batch
from nest.graph import fx_extract as fx
from nest.graph.layer_graph import Variant

from hf_models import load as _load


def _corners(m, ep=(1,)):
    pv = m.parallel_variants
    t, c = max(pv.tp), max(pv.cp)
    return [Variant(1, False, e, 1) for e in ep] + [Variant(t, t > 1, e, c) for e in ep] + [
        Variant(t, False, ep[-1], 1)]


def _same(m, variants, mbs_list=(1, 2, 3, 4)):
    for mbs in mbs_list:
        derived = fx.build_layer_graph_fx(m, mbs, variants).to_dict()
        traced = fx.build_layer_graph_fx(m, mbs, variants, derive_mbs=False).to_dict()
        assert derived == traced, (m.name, mbs)


CASES = [  # (model, sequence, expert-parallel degrees)
    ("tiny_gpt", None, (1,)),  # dropout, learned positions, GELU
    ("bert_large", None, (1,)),  # bidirectional, post-norm, MLM head
    ("llama_3_70b.json", 512, (1,)),  # grouped-query attention, RoPE, SwiGLU
    ("mixtral_mini", None, (1, 2, 8)),  # MoE, ep derived from ep 2 and 4
    ("gemma_3_1b_pt.json", 1024, (1,)),  # 5:1 sliding window, QK norm, soft-capped logits
    ("gpt_oss_20b.json", 512, (1, 4)),  # attention sinks, alternating window, MoE with biases
    ("olmo_2_1124_7b.json", 512, (1,)),  # post-norms, full QK norm all-reduced over tp
]


@pytest.mark.parametrize("name,seq,eps", CASES, ids=[c[0] for c in CASES])
def test_derived_micro_batches_equal_traced(name, seq, eps):
    m = _load(name, seq)
    assert all(fx_batch.taggable(m, v) for v in _corners(m, eps))  # the derivation runs
    _same(m, _corners(m, eps))


def test_deepseek_v3_mla_dense_first_and_mtp():
    """The real DeepSeek-V3 config at its planning sequence: MLA, 3 dense + 58 MoE blocks, the MTP
    module in the head; ep 8 derived (nest.graph.fx_ep) from micro-batch-derived ep 2 and 4."""
    m = _load("deepseek_v3.json", 4096)
    _same(m, [Variant(1, False, 1, 1), Variant(8, True, 8, 8)], (1, 2, 3))


def test_untaggable_moe_is_slot_tagged_and_equal():
    """Qwen1.5-MoE at sequence 512: 60 experts do not divide 512 x 4 slots, the slots per expert
    are rounded up (not linear in the micro-batch): the block is traced with the slots at their
    own tag (tests/test_fx_slots.py), micro-batch 15 (no padding) is traced; same graph."""
    m = _load("qwen1_5_moe_a2_7b.json", 512)
    v = Variant(1, False, 1, 1)
    assert not fx_batch.taggable(m, v)
    assert fx._tagged(fx._dims(m), "block", v).slotted
    assert not fx._tagged(fx._dims(m), "embedding", v).slotted
    _same(m, [v], (1, 2, 15))


def test_a_wrong_tag_is_caught(monkeypatch):
    """The comparison can fail: with a tag that divides other dimensions (2), the split batch
    degrees are wrong and the derived graph differs from the traced one."""
    m = _load("tiny_gpt")
    fx.clear_caches()
    monkeypatch.setattr(fx_batch, "tag_prime", lambda spec: 2)
    with pytest.raises(AssertionError):
        _same(m, [Variant()], (3,))
    fx.clear_caches()


def test_poly_splits_the_batch_degree():
    p = 10007
    x = fx_batch.poly([5 * p * p, 7 * p, 11, 0, 3 * p], p)
    assert x == (((0, 0), 11), ((1, 0), 10), ((2, 0), 5))
    assert fx_batch.at(x, 3) == 11 + 30 + 45
    assert fx_batch.poly([12, 2.0], None) == (((0, 0), 14),)
    with pytest.raises(fx_batch.NotTagged):
        fx_batch.poly([0.5], p)
    assert fx_batch.tag_prime(_load("tiny_gpt")) > 1000


def test_tag_prime_is_above_every_sum_of_spec_integers():
    """No dimension built from spec integers by sums and products may carry the tag: the prime
    exceeds the sum of them all (DeepSeek-V3: a LoRA rank plus a rope dimension is a sum)."""
    m = _load("deepseek_v3.json", 4096)
    p = fx_batch.tag_prime(m)
    assert fx_batch._is_prime(p) and p > sum(fx_batch._spec_ints(m))
