"""MoE token dispatch with tensor parallelism: bytes worked out by hand from Megatron-Core's
MoEAlltoAllTokenDispatcher (megatron/core/transformer/moe/token_dispatcher.py), and the
closed-form and torch.fx graphs agreeing on them."""

import dataclasses
from collections import Counter

import pytest

from nest.graph import closed_form as cf
from nest.graph import fx_extract as fx
from nest.graph.layer_graph import Variant
from nest.spec.catalog import ParallelVariants, load_model

TP1_EP4, TP2_EP4 = Variant(1, False, 4), Variant(2, True, 4)


def _mini():
    """mixtral_mini (h 1024, seq 1024, 8 experts, top-2) declared with tp 2 + sp as well."""
    m = load_model("mixtral_mini")
    return dataclasses.replace(m, parallel_variants=ParallelVariants(
        tp=(1, 2), sp=(True,), ep=(1, 4), cp=(1,)))


def _moe_collectives(cost) -> Counter:
    """(kind, phase, group, bytes) -> count of the collectives over ep and of the 4 MiB ones."""
    out = Counter()
    for c in cost.collectives:
        if c.group == "ep" or c.bytes == 4 * 2 ** 20:
            out[c.kind, c.phase, c.group, c.bytes] += c.count
    return +out


@pytest.fixture(scope="module")
def graphs():
    m = _mini()
    return (cf.build_layer_graph(m, 1, [TP1_EP4, TP2_EP4]),
            fx.build_layer_graph_fx(m, 1, [TP1_EP4, TP2_EP4]))


def test_tp2_ep4_dispatch_bytes_by_hand(graphs):
    # micro-batch 1: 1,024 tokens. With tp 2 and sp each rank holds 512 of them and routes each to
    # top-2 experts: token_dispatch all-to-alls 512 * 2 = 1,024 copies of h = 1,024 bf16 values,
    # 1,024 * 1,024 * 2 B = 2 MiB (token_combine the same back; forward and backward alike).
    # Balanced routing: a rank receives as many copies as it sends, and dispatch_postprocess
    # all-gathers them over the expert-tensor-parallel group (size tp = 2): 2 * 1,024 copies =
    # 4 MiB; combine_preprocess reduce-scatters those 4 MiB, and backward runs the conjugates.
    a2a, etp = 1024 * 1024 * 2, 2 * 1024 * 1024 * 2
    expect = Counter({("all_to_all", "fwd", "ep", a2a): 2, ("all_to_all", "bwd", "ep", a2a): 2,
                      ("all_gather", "fwd", "tp", etp): 1, ("reduce_scatter", "fwd", "tp", etp): 1,
                      ("reduce_scatter", "bwd", "tp", etp): 1, ("all_gather", "bwd", "tp", etp): 1})
    for g in graphs:
        assert _moe_collectives(g.layers[1].costs[TP2_EP4.key]) == expect, g.source


def test_tp1_dispatch_unchanged(graphs):
    # tp 1: a rank holds all 1,024 tokens and dispatches 2,048 copies (4 MiB), no gather
    a2a = 2 * 1024 * 1024 * 2
    expect = Counter({("all_to_all", "fwd", "ep", a2a): 2, ("all_to_all", "bwd", "ep", a2a): 2})
    for g in graphs:
        assert _moe_collectives(g.layers[1].costs[TP1_EP4.key]) == expect, g.source


def test_tp2_ep4_graphs_agree(graphs):
    c, f = (g.layers[1].costs[TP2_EP4.key] for g in graphs)

    def every(cost):
        out = Counter()
        for x in cost.collectives:
            out[x.kind, x.phase, x.group, x.bytes] += x.count
        return +out

    assert every(c) == every(f)
    assert f.fwd_flops == pytest.approx(c.fwd_flops, rel=1e-2)
    assert f.expert_params == c.expert_params


def test_local_sort_runs_on_the_gathered_tokens(graphs):
    # dispatch_postprocess sorts by local expert after the expert-tensor-parallel all-gather, so
    # at tp 2 it reads and writes the gathered 4 MiB, as the whole 4 MiB dispatch at tp 1 does
    from nest.costs.table import moe_local_sort_op

    for g in graphs:
        for v in (TP1_EP4, TP2_EP4):
            (op,) = moe_local_sort_op(g.layers[1].costs[v.key])
            assert (op.fwd_bytes, op.bwd_bytes, op.count) == (2 * 4 * 2 ** 20,) * 2 + (2,), v
