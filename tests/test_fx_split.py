"""Tensor- and context-parallel degrees above 4 derived from the degree 2 and 4 traces
(nest.graph.fx_split) equal their own traces, field for field, for every variant of dense, MoE,
MLA and sliding-window models."""

from __future__ import annotations

import pytest

from nest.graph import fx_extract as fx
from nest.graph import fx_split
from nest.graph.closed_form import variants_of
from nest.graph.layer_graph import Variant

from hf_models import load as _load


def _same(m, variants, mbs=1, derive_mbs=True):
    derived = fx.build_layer_graph_fx(m, mbs, variants, derive_mbs=derive_mbs)
    traced = fx.build_layer_graph_fx(m, mbs, variants, derive_mbs=derive_mbs,
                                     derive_split=False)
    assert derived.to_dict() == traced.to_dict()


CASES = [  # (model, sequence, expert-parallel degrees kept)
    ("llama_3_70b.json", 512, (1,)),
    ("olmo_2_1124_7b.json", 512, (1,)),  # full QK norm: tp-independent all-reduces
    ("gpt_oss_20b.json", 512, (8,)),  # sinks, window, MoE with sp all-to-all divisor t
    ("deepseek_v3.json", 1024, (8,)),  # MLA, dense + MoE blocks, MTP head
    ("mixtral_mini", None, (1, 4)),
]


@pytest.mark.parametrize("name,seq,eps", CASES, ids=[c[0] for c in CASES])
def test_derived_degrees_equal_traced(name, seq, eps):
    """Every variant with a derived degree (tp 8 or cp 8) of the model's variant set."""
    m = _load(name, seq)
    variants = [v for v in variants_of(m) if v.ep in eps and (
        fx_split.derivable(m, v, "tp", None) or fx_split.derivable(m, v, "cp", None))]
    assert variants  # the derivation runs
    _same(m, variants)


def test_derived_from_micro_batch_traces():
    """Records traced at the micro-batch itself (no batch tag) derive the same way."""
    m = _load("llama_3_70b.json", 512)
    _same(m, [v for v in variants_of(m) if v.cp == 8 and v.tp in (1, 8)], mbs=2, derive_mbs=False)


def test_vocab_not_divisible_is_traced():
    """BERT's 30,522 tokens do not split over tp = 8 (the shard is rounded up): traced."""
    m = _load("bert_large")
    assert not fx_split.derivable(m, Variant(tp=8), "tp", None)
    assert fx_split.derivable(_load("llama_3_70b.json", 512), Variant(tp=8), "tp", None)


def test_a_broken_fit_is_caught(monkeypatch):
    """The comparison can fail: a fit with the wrong sign gives a different graph."""
    m = _load("llama_3_70b.json", 512)
    fx.clear_caches()
    monkeypatch.setattr(fx_split, "_fit", lambda x2, x4, d: x4 + (x2 - x4) // 2)
    with pytest.raises(AssertionError):
        _same(m, [Variant(8, True, 1, 1)])
    fx.clear_caches()


@pytest.mark.parametrize("name,seq", [("gpt_oss_20b.json", 256), ("deepseek_v3.json", 256),
                                      ("gemma_3_1b_pt.json", 256), ("bert_large", None)])
def test_graph_cache_leaves_the_graph_unchanged(name, seq, monkeypatch):
    """fx_extract._graph shares one traced fx graph among modules of the same structure: the
    layer graph equals the one traced with a fresh fx graph for every module (ep <= 4: the
    traced expert-parallel degrees), tp 1, 2, 4 with and without sp, cp 1 and 4."""
    m = _load(name, seq)
    variants = [v for v in variants_of(m) if v.ep <= 2 and v.tp <= 4 and v.cp in (1, 4)]
    fx.clear_caches()
    shared = fx.build_layer_graph_fx(m, 1, variants).to_dict()
    assert len(fx._GRAPHS) < fx._rec.cache_info().currsize  # graphs were shared
    fx.clear_caches()
    monkeypatch.setattr(fx, "_graph", lambda spec, kind, module: fx._Tracer().trace(module))
    assert fx.build_layer_graph_fx(m, 1, variants).to_dict() == shared
    fx.clear_caches()


@pytest.mark.parametrize("name,seq", [("gpt_oss_20b.json", 256), ("deepseek_v3.json", 256),
                                      ("gemma_3_1b_pt.json", 256), ("tiny_gpt", None),
                                      ("bert_large", None), ("olmo_2_1124_7b.json", 256)])
def test_selective_bytes_equal_the_checkpointed_pass(name, seq, monkeypatch):
    """Selective recomputation's saved bytes read from the pass without recomputation
    (fx_extract._selective_from_pass1) equal a forward run with the attention core under
    torch.utils.checkpoint (fx_extract.TRACE_SELECTIVE), every tp / sp / cp corner."""
    m = _load(name, seq)
    variants = [v for v in variants_of(m) if v.ep <= 2 and v.tp in (1, 2) and v.cp in (1, 2)]
    fx.clear_caches()
    read = fx.build_layer_graph_fx(m, 1, variants).to_dict()
    fx.clear_caches()
    monkeypatch.setattr(fx, "TRACE_SELECTIVE", True)
    assert fx.build_layer_graph_fx(m, 1, variants).to_dict() == read
    fx.clear_caches()
