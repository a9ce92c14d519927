"""Closed-form layer graph against independent formulas (Korthikanti et al. 2022, Kaplan 2020)."""

import pytest

from nest.graph.closed_form import block_params, build_layer_graph, variants_of
from nest.graph.layer_graph import LayerGraph, Variant
from nest.spec.catalog import load_model


def _block(graph, v):
    return graph.layers[1].costs[v.key]


@pytest.mark.parametrize("name", ["gpt3_175b", "llama2_7b", "llama3_70b", "bert_large",
                                  "mixtral_8x7b"])
def test_block_forward_flops(name):
    """2 x (matmul params) x tokens + attention scores/values term (4 b s^2 h, halved if causal)."""
    m = load_model(name)
    g = build_layer_graph(m, mbs=2)
    b, s, h = 2, m.seq_len, m.hidden_size
    if m.is_moe:
        active = block_params(m) - (m.num_experts - m.top_k) * 3 * h * m.ffn_hidden_size
    else:
        active = block_params(m)
    norms_and_biases = 2 * (2 * h if m.norm == "layernorm" else h)
    if m.family in ("bert", "gpt"):
        norms_and_biases += 3 * h + h + m.ffn_hidden_size + h  # biases: qkv, out, fc1, fc2
    matmul_params = active - norms_and_biases
    att = 4 * b * s * s * h * (0.5 if m.causal else 1.0)
    expect = 2 * matmul_params * b * s + att
    assert _block(g, Variant()).fwd_flops == pytest.approx(expect, rel=1e-2)
    assert _block(g, Variant()).bwd_flops == pytest.approx(2 * expect, rel=1e-9)


def test_gpt_activation_memory_korthikanti():
    """GPT-3 block: s b h (34 + 5 a s / h) bytes; t=8: s b h (10 + 24/t + 5 a s/(h t));
    t=8 + sp: s b h / t (34 + 5 a s / h); selective drops the 5as/h term; full keeps 2 s b h."""
    m = load_model("gpt3_175b")
    s, b, h, a, t = m.seq_len, 1, m.hidden_size, m.num_heads, 8
    g = build_layer_graph(m, 1, [Variant(), Variant(8, False), Variant(8, True)])
    base = _block(g, Variant()).act_bytes
    assert base["none"] == pytest.approx(s * b * h * (34 + 5 * a * s / h), rel=1e-12)
    assert base["selective"] == pytest.approx(34 * s * b * h, rel=1e-12)
    assert base["full"] == pytest.approx(2 * s * b * h, rel=1e-12)
    tp = _block(g, Variant(8, False)).act_bytes
    assert tp["none"] == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)
    assert tp["selective"] == pytest.approx(s * b * h * (10 + 24 / t), rel=1e-12)
    sp = _block(g, Variant(8, True)).act_bytes
    assert sp["none"] == pytest.approx(s * b * h / t * (34 + 5 * a * s / h), rel=1e-12)
    assert sp["full"] == pytest.approx(2 * s * b * h / t, rel=1e-12)


def test_tensor_parallel_shards_split_matrices_only():
    m = load_model("gpt3_175b")
    g = build_layer_graph(m, 1, [Variant(), Variant(8, True)])
    h = m.hidden_size
    full = _block(g, Variant()).dense_params
    sharded = _block(g, Variant(8, True)).dense_params
    # replicated: 2 LayerNorms (4h), out-proj bias (h), fc2 bias (h); the rest splits by 8
    replicated = 4 * h + 2 * h
    assert full == block_params(m)
    assert sharded == pytest.approx((full - replicated) / 8 + replicated, rel=1e-12)


def test_expert_parallel_shards_experts():
    m = load_model("mixtral_8x7b")
    g = build_layer_graph(m, 1, [Variant(), Variant(ep=4)])
    e1, e4 = _block(g, Variant()), _block(g, Variant(ep=4))
    assert e1.expert_params == 8 * 3 * 4096 * 14336
    assert e4.expert_params == e1.expert_params / 4
    assert e4.dense_params == e1.dense_params  # attention and router are not sharded by ep
    a2a = [c for c in e4.collectives if c.kind == "all_to_all"]
    assert sum(c.count for c in a2a) == 4  # dispatch + combine, forward and backward


def test_tp_collectives_per_block():
    m = load_model("gpt3_175b")
    g = build_layer_graph(m, 1, [Variant(4, False), Variant(4, True)])
    s, h = m.seq_len, m.hidden_size
    ar = [c for c in _block(g, Variant(4, False)).collectives]
    assert {(c.kind, c.phase, c.count) for c in ar} == {("all_reduce", "fwd", 2),
                                                        ("all_reduce", "bwd", 2)}
    assert all(c.bytes == 2 * s * h for c in ar)
    sp = _block(g, Variant(4, True)).collectives
    # each all-reduce becomes all-gather + reduce-scatter (4 + 4), plus the 2 backward
    # re-gathers of the sequence-sharded QKV / FC1 inputs (Korthikanti et al. 2022, 4.2.2)
    assert sum(c.count for c in sp if c.kind == "all_gather") == 4 + 2
    assert sum(c.count for c in sp if c.kind == "reduce_scatter") == 4


def test_layers_are_separate_and_counted_once():
    m = load_model("llama2_7b")
    g = build_layer_graph(m)
    assert [la.kind for la in g.layers] == ["embedding"] + ["block"] * 32 + ["head"]
    assert g.layers[0].num_params == g.layers[-1].num_params - 4096 == 32000 * 4096


def test_variants_declared():
    keys = [v.key for v in variants_of(load_model("gpt3_175b"))]
    assert keys == ["tp1_sp0_ep1_cp1", "tp4_sp0_ep1_cp1", "tp4_sp1_ep1_cp1", "tp8_sp0_ep1_cp1",
                    "tp8_sp1_ep1_cp1"]


def test_variants_keep_tp1_expert_parallelism_under_sp_true():
    # DeepSeek-V3 declares tp [1, 8], sp [true], ep [8..64]: its report trains with no tensor
    # parallelism and 64-way expert parallelism (arXiv 2412.19437, section 3.2), so tp 1 with
    # every declared ep must be a variant (sp dropped: there is no tensor group to split over).
    m = load_model("deepseek_v3")
    got = {v.key for v in variants_of(m)}
    pv = m.parallel_variants
    want = {Variant().key} | {f"tp{t}_sp{int(t > 1)}_ep{e}_cp{c}" for t in pv.tp for e in pv.ep
                               for c in pv.cp}
    assert got == want
    assert "tp1_sp0_ep64_cp1" in got


def test_json_round_trip(tmp_path):
    g = build_layer_graph(load_model("tiny_moe"), 2)
    g.write(tmp_path / "g.json")
    back = LayerGraph.read(tmp_path / "g.json")
    assert back.to_dict() == g.to_dict()
