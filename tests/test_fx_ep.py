"""Expert-parallel variants derived from the ep = 2 and ep = 4 traces (nest.graph.fx_ep) equal
the per-variant traces exactly: every family fixture with experts and every catalog MoE model,
every ep, at the two corners of (tp, sp, cp)."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest

from nest.graph import fx_ep
from nest.graph import fx_extract as fx
from nest.graph.layer_graph import Variant
from nest.graph.torch_models import block_kinds
from nest.spec.catalog import ParallelVariants, load_model

HF = Path(__file__).parent / "fixtures" / "hf"
MODELS = [str(HF / f) for f in ("deepseek_v3.json", "gpt_oss_20b.json", "mixtral_8x22b.json",
                                "qwen1_5_moe_a2_7b.json")] + ["mixtral_8x7b", "mixtral_mini",
                                                              "tiny_moe"]
EPS = (1, 2, 4, 8, 16, 32, 64)


def _spec(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = load_model(name, seq_len=1024) if name.endswith(".json") else load_model(name)
    pv = m.parallel_variants
    eps = tuple(e for e in EPS if m.num_experts % e == 0)
    corners = [(1, False, 1), (max(pv.tp), max(pv.tp) > 1, max(pv.cp))]
    variants = [Variant(t, sp, e, c) for t, sp, c in corners for e in eps]
    return dataclasses.replace(m, parallel_variants=ParallelVariants(
        tp=tuple(sorted({1, max(pv.tp)})), sp=(False, True) if max(pv.tp) > 1 else (False,),
        ep=eps, cp=tuple(sorted({1, max(pv.cp)})))), variants


@pytest.mark.parametrize("name", MODELS, ids=lambda n: Path(n).stem)
def test_derived_ep_equals_traced(name):
    m, variants = _spec(name)
    derived = fx.build_layer_graph_fx(m, 1, variants)
    traced = fx.build_layer_graph_fx(m, 1, variants, derive_ep=False)
    assert derived.to_dict() == traced.to_dict()
    # the derivation did run (and can therefore fail): every ep > 4 of a layer with experts
    n = 0
    for kind in dict.fromkeys(block_kinds(m)):
        for v in variants:
            t2, t4 = (fx.trace_layer(m, kind, b) for b in fx_ep.bases(v))
            if fx_ep.can_derive(m.num_experts, v) and t4.variant.ep == 4:
                cost = fx_ep.derive(t2, t4, m.num_experts, v.ep)
                assert cost == fx.trace_layer(m, kind, v).cost
                n += 1
    assert n > 0 or m.num_experts % 8


def test_not_affine_falls_back():
    """Two traces that are not the ep pattern (different op lists) give None: traced instead."""
    m, _ = _spec("mixtral_mini")
    a = fx.trace_layer(m, block_kinds(m)[0], Variant(1, False, 2))
    assert fx_ep.derive(a, fx.trace_layer(m, "embedding", Variant()), m.num_experts, 8) is None
