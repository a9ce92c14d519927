"""MoE layers whose slots per expert ceil(T k / E) are not linear in the micro-batch (E does not
divide s_loc k) are traced once with the slots at their own tag (nest.graph.fx_batch.slot_prime)
and every padded micro-batch, tp / cp 8 (nest.graph.fx_split) and ep 8 / 16 (nest.graph.fx_ep)
derived from that: the layer graph equals, field for field, the one traced at every micro-batch
and variant (derive_mbs=False, derive_split=False, derive_ep=False)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from nest.graph import fx_batch
from nest.graph import fx_extract as fx
from nest.graph.layer_graph import Variant
from nest.spec.catalog import ParallelVariants, load_model

from hf_models import load as _load

DSV2 = Path(__file__).parents[1] / "benchmarks" / "inputs" / "deepseek_v2.json"


def _synthetic():
    """A small MoE (mixtral_mini's block) with 80 experts, top-2: b x 2 x 1024 / c slots divide
    by 80 only when 5 divides b, ep up to 16."""
    m = _load("mixtral_mini")
    return dataclasses.replace(m, name="mini_80e", num_experts=80, top_k=2,
                               parallel_variants=ParallelVariants(
                                   tp=(1, 2, 4, 8), sp=(False, True), ep=(1, 2, 4, 8, 16),
                                   cp=(1, 2, 4, 8)))


def _spec(name):
    if name == "deepseek_v2":  # MLA, 1 dense + 59 MoE blocks, 160 experts top-6, shared experts
        return load_model(str(DSV2), seq_len=4096)
    if name == "qwen1_5_moe":  # 60 experts top-4, shared expert with a sigmoid gate, ep <= 4
        return _load("qwen1_5_moe_a2_7b.json", 4096)
    return _synthetic()


CASES = {  # variants: every derivation (tp 8, cp 8, ep 8 / 16) and the traced corners
    "deepseek_v2": [Variant(1, False, 1, 1), Variant(8, True, 1, 1), Variant(2, False, 1, 8),
                    Variant(8, False, 16, 1), Variant(4, True, 8, 8)],
    "qwen1_5_moe": [Variant(1, False, 1, 1), Variant(8, True, 4, 1), Variant(2, True, 2, 8),
                    Variant(8, False, 1, 8)],
    "mini_80e": [Variant(1, False, 1, 1), Variant(8, True, 1, 8), Variant(2, False, 16, 1),
                 Variant(8, False, 8, 2), Variant(4, True, 16, 8)],
}


def _traces(monkeypatch):
    """Record every torch.fx trace (fx_extract._record) as (kind, variant, batch, slot tag)."""
    calls, record = [], fx._record

    def counted(m, kind, v, b, tag, slot_tag=None):
        calls.append((kind, v, b if tag is None else "tag", slot_tag))
        return record(m, kind, v, b, tag, slot_tag)

    monkeypatch.setattr(fx, "_record", counted)
    return calls


@pytest.mark.parametrize("name", list(CASES))
def test_slot_tagged_graph_equals_traced(name, monkeypatch):
    m, variants = _spec(name), CASES[name]
    assert not any(fx_batch.taggable(m, v) for v in variants)  # the slot tag is needed
    assert all(fx_batch.padded(m, v, mbs) for v in variants for mbs in (1, 2, 3, 4))
    fx.clear_caches()
    calls = _traces(monkeypatch)
    derived = {mbs: fx.build_layer_graph_fx(m, mbs, variants).to_dict() for mbs in (1, 2, 3, 4)}
    # one tagged trace per (kind, traced variant), none at tp or cp 8 or ep above 4, and the
    # expert layers at the slot tag: the derivations ran (and can therefore fail)
    assert all(b == "tag" and v.tp <= 4 and v.cp <= 4 and v.ep <= 4 for _, v, b, _ in calls)
    assert {bool(q) for kind, *_, q in calls if kind == "block"} == {True}
    assert len(calls) == len(set(calls))
    for mbs in (1, 2, 3, 4):
        traced = fx.build_layer_graph_fx(m, mbs, variants, derive_ep=False, derive_mbs=False,
                                         derive_split=False).to_dict()
        assert derived[mbs] == traced, (name, mbs)
    fx.clear_caches()


def test_unpadded_micro_batch_is_traced(monkeypatch):
    """DeepSeek-V2 at micro-batch 5: 5 x 4096 x 6 slots divide by 160 (no padding, the permute
    takes the other branch): traced at 5 itself, and equal to the fully traced graph."""
    m = _spec("deepseek_v2")
    v = Variant(2, True, 8, 1)
    assert fx_batch.padded(m, v, 4) and not fx_batch.padded(m, v, 5)
    fx.clear_caches()
    calls = _traces(monkeypatch)
    derived = fx.build_layer_graph_fx(m, 5, [v]).to_dict()
    assert ("block", Variant(2, True, 4, 1), 5, None) in calls
    fx.clear_caches()
    assert derived == fx.build_layer_graph_fx(m, 5, [v], derive_ep=False, derive_mbs=False,
                                              derive_split=False).to_dict()
    fx.clear_caches()


def test_bases_tagged_otherwise_are_not_combined(monkeypatch):
    """DeepSeek-V3 at sequence 320: 320 x 8 / c slots divide by 256 experts at cp 1 and 2 but
    not at cp 4 and 8, so cp 8 (slot-tagged) is not derived from a batch-tagged cp 2: traced.
    Its head holds the MTP block's experts (slot-tagged too); the graph equals the traced one."""
    m = _load("deepseek_v3.json", 320)
    v = Variant(1, False, 1, 8)
    assert fx_batch.taggable(m, Variant(cp=2)) and not fx_batch.taggable(m, v)
    fx.clear_caches()
    calls = _traces(monkeypatch)
    derived = {mbs: fx.build_layer_graph_fx(m, mbs, [v]).to_dict() for mbs in (1, 3)}
    assert ("block", v, "tag", fx_batch.slot_prime(m, fx_batch.tag_prime(m))) in calls
    assert [c for c in calls if c[0] == "head" and c[1] == v and c[3]]
    assert ("embedding", v, "tag", None) not in calls  # no experts: batch-tagged, derived
    for mbs in (1, 3):
        assert derived[mbs] == fx.build_layer_graph_fx(
            m, mbs, [v], derive_mbs=False, derive_split=False).to_dict()
    fx.clear_caches()


def test_wrong_slot_count_is_caught(monkeypatch):
    """The comparison can fail: materialised at one slot per expert more than ceil(T k / E),
    the derived graph differs from the traced one."""
    m, variants, slots = _synthetic(), [Variant(1, False, 2, 1)], fx_batch.slots
    fx.clear_caches()
    monkeypatch.setattr(fx_batch, "slots", lambda spec, v, mbs: slots(spec, v, mbs) + 1)
    with pytest.raises(AssertionError):
        assert fx.build_layer_graph_fx(m, 1, variants).to_dict() == fx.build_layer_graph_fx(
            m, 1, variants, derive_mbs=False).to_dict()
    fx.clear_caches()


def test_poly_splits_batch_and_slot_degrees():
    p, q = 10007, 10009
    x = fx_batch.poly([3 * p * q, 5 * q, 7 * p, 11, 2 * q], p, q)
    assert x == (((0, 0), 11), ((0, 1), 7), ((1, 0), 7), ((1, 1), 3))
    assert fx_batch.at(x, 2, 5) == 11 + 35 + 14 + 30
    m = _spec("deepseek_v2")
    tag = fx_batch.tag_prime(m)
    slot = fx_batch.slot_prime(m, tag)
    assert fx_batch._is_prime(slot) and slot > tag
    assert slot * m.num_experts > tag * m.seq_len * m.top_k  # the tagged trace pads, cp 1 too
