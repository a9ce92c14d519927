"""torch.fx layer graphs (meta device) against published sizes, Korthikanti et al. 2022, the
analytic FLOP formula, the closed-form graph, and a Hugging Face config.json."""

from collections import Counter
from pathlib import Path

import pytest

from nest.graph import closed_form as cf
from nest.graph import fx_extract as fx
from nest.graph.layer_graph import LayerGraph, Variant
from nest.graph.torch_models import build_layer
from nest.common.errors import SpecError
from nest.spec.catalog import catalog_names, load_model, model_spec_from_hf_config



def _closed_form_prices(name: str) -> bool:
    """The closed form prices the model (a Hugging Face family's own features, e.g. DeepSeek-V3's
    multi-latent attention, are traced only: tests/test_hf_families.py checks those)."""
    try:
        cf.check_supported(load_model(name))
    except SpecError:
        return False
    return True


MODELS = [name for name in catalog_names("models") if _closed_form_prices(name)]
APPROXIMATE_SIZES = {"gpt3_35b", "mixtral_mini"}  # "~35 B", "~790 M"
HF_TINY_LLAMA = Path(__file__).parent / "fixtures" / "tiny_llama_config.json"


def _block(m, v=None, mbs=1):
    return fx.trace_layer(m, "block", v, mbs).cost


@pytest.mark.parametrize("name", MODELS)
def test_total_params_closed_form_and_published(name):
    m = load_model(name)
    assert fx.total_params(m) == cf.total_params(m)
    if m.published_num_params:  # approximate sizes (docs/paper.md, Models) are checked at 1%
        tol = 1e-2 if name in APPROXIMATE_SIZES else 5e-3
        assert fx.total_params(m) == pytest.approx(m.published_num_params, rel=tol)


@pytest.mark.parametrize("name", MODELS)
def test_block_forward_flops_formula_and_backward(name):
    """fwd = 2 x (active matmul params) x tokens + 4 b s^2 h (halved if causal); bwd = 2 x fwd
    for every matmul and the attention core; memory operators carry no FLOPs."""
    m, b = load_model(name), 2
    h, hkv, f, s = m.hidden_size, m.kv_hidden_size, m.ffn_hidden_size, m.seq_len
    mlp = (m.top_k * 3 * h * f + h * m.num_experts) if m.is_moe else (
        3 * h * f if m.ffn_type == "swiglu" else 2 * h * f)
    matmul_params = h * (h + 2 * hkv) + h * h + mlp
    att = 4 * b * s * s * h * (0.5 if m.causal else 1.0)
    cost = _block(m, mbs=b)
    assert cost.fwd_flops == pytest.approx(2 * matmul_params * b * s + att, rel=1e-2)
    for op in cost.ops:
        assert op.bwd_flops == (2 * op.fwd_flops if op.kind != "memory" else 0.0), op.name
        assert op.kind != "memory" or op.fwd_flops == 0.0, op.name


def test_gpt3_saved_bytes_korthikanti():
    """Measured with saved-tensor hooks against Korthikanti et al. 2022, section 4 (bytes):
    s b h (34 + 5 a s / h); t=8: s b h (10 + 24/t + 5 a s/(h t)); t=8 + sp: all of it / t;
    selective drops the 5 a s / h term; full keeps only the block input 2 s b h (/t with sp).
    Residual: each LayerNorm also keeps fp32 mean and rstd (8 s b bytes, 16 s b per block, about
    4e-5 of the total at h = 12288) which the formula omits; nothing else differs."""
    m = load_model("gpt3_175b")
    s, b, h, a, t = m.seq_len, 1, m.hidden_size, m.num_heads, 8
    base = _block(m).act_bytes
    assert base["none"] == pytest.approx(s * b * h * (34 + 5 * a * s / h), rel=0.05)
    assert base["selective"] == pytest.approx(34 * s * b * h, rel=0.05)
    assert base["full"] == pytest.approx(2 * s * b * h, rel=0.05)
    assert base["none"] - s * b * h * (34 + 5 * a * s / h) == 16 * s * b  # exactly the LN stats
    tp = _block(m, Variant(t, False)).act_bytes
    assert tp["none"] == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)), rel=0.05)
    assert tp["selective"] == pytest.approx(s * b * h * (10 + 24 / t), rel=0.05)
    sp = _block(m, Variant(t, True)).act_bytes
    assert sp["none"] == pytest.approx(s * b * h / t * (34 + 5 * a * s / h), rel=0.05)
    assert sp["selective"] == pytest.approx(s * b * h / t * 34, rel=0.05)
    assert sp["full"] == 2 * s * b * h / t


def test_tensor_parallel_splits_matrices_and_replicates_the_rest():
    m = load_model("gpt3_175b")
    full = dict(build_layer(m, "block")[0].named_parameters())
    shard = dict(build_layer(m, "block", Variant(8, True))[0].named_parameters())
    split = {"qkv.weight", "qkv.bias", "out_proj.weight", "mlp.up.weight", "mlp.up.bias",
             "mlp.down.weight"}
    for name, p in full.items():
        assert p.numel() == shard[name].numel() * (8 if name in split else 1), name
    replicated = sum(p.numel() for n, p in full.items() if n not in split)
    assert replicated == 6 * m.hidden_size  # 2 LayerNorms, out-proj and fc2 biases
    c1, c8 = _block(m), _block(m, Variant(8, True))
    assert c8.dense_params == (c1.dense_params - replicated) / 8 + replicated


def test_expert_parallel_shards_experts_only():
    m = load_model("mixtral_8x7b")
    e1, e4 = _block(m), _block(m, Variant(ep=4))
    assert e1.expert_params == 8 * 3 * 4096 * 14336 and e4.expert_params == e1.expert_params / 4
    assert e4.dense_params == e1.dense_params  # attention, norms and router are not sharded
    a2a = [c for c in e4.collectives if c.kind == "all_to_all"]
    tokens_k = m.seq_len * m.top_k
    assert {(c.phase, c.count, c.bytes) for c in a2a} == {("fwd", 2, 2 * tokens_k * 4096),
                                                          ("bwd", 2, 2 * tokens_k * 4096)}
    gate_up = next(o for o in e4.ops if o.name == "expert_gate_up")
    assert gate_up.count == 2 and gate_up.shape == (tokens_k * 4 // 8, 2 * 14336, 4096)


def test_context_parallel_ring_exchange():
    m = load_model("mixtral_8x7b")
    c = _block(m, Variant(cp=4))
    kv = 2 * 2 * m.seq_len * m.kv_hidden_size  # K and V of the whole sequence, bf16
    assert {(x.kind, x.phase, x.bytes, x.count) for x in c.collectives} == {
        ("all_gather", "fwd", kv, 1), ("all_gather", "bwd", kv, 1),
        ("reduce_scatter", "bwd", kv, 1)}
    att = next(o for o in c.ops if o.kind == "attention")
    assert att.shape == (1, 32, m.seq_len // 4, m.seq_len, 128)


# ---- fx graph == closed-form graph, with every known difference named ---------------------


def _collectives(cost) -> Counter:
    """(kind, phase, group, bytes) -> count."""
    out = Counter()
    for c in cost.collectives:
        out[c.kind, c.phase, c.group, c.bytes] += c.count
    return +out


@pytest.mark.parametrize("name", MODELS)
def test_fx_graph_agrees_with_closed_form(name):
    m = load_model(name)
    g, c = fx.build_layer_graph_fx(m), cf.build_layer_graph(m)
    assert g.source == "torch_fx" and [v.key for v in g.variants] == [v.key for v in c.variants]
    assert [la.kind for la in g.layers] == [la.kind for la in c.layers]
    for lf, lc in zip(g.layers, c.layers):
        assert lf.num_params == lc.num_params
        for v in g.variants:
            a, b = lf.costs[v.key], lc.costs[v.key]
            where = f"{name} {lf.name} {v.key}"
            # ceil(V/t) vocabulary rows per rank (closed form: V/t) -> 1e-3 on embedding/head
            assert a.dense_params == pytest.approx(b.dense_params,
                                                   rel=0 if lf.kind == "block" else 1e-3), where
            assert a.expert_params == b.expert_params, where
            assert a.fwd_flops == pytest.approx(b.fwd_flops, rel=1e-2), where
            assert a.bwd_flops == pytest.approx(b.bwd_flops, rel=1e-2), where
            T = m.seq_len // v.cp
            for mode in ("none", "selective", "full"):
                expect = b.act_bytes[mode]
                # + integer token ids / routing indices (<= 24 B per token) the closed form omits
                assert abs(a.act_bytes[mode] - expect) <= 0.05 * expect + 24 * T, (where, mode)
            assert a.output_bytes == pytest.approx(b.output_bytes, rel=1e-3), where
            assert _collectives(a) == _collectives(b), where
            assert set(b.recompute_ops["selective"]) == set(a.recompute_ops["selective"])


# ---- graph plumbing ---------------------------------------------------------------------------


def test_unsupported_variant_is_named():
    with pytest.raises(ValueError, match="tp=8"):
        build_layer(load_model("tiny_llama"), "block", Variant(8))  # 4 KV heads


def test_per_node_costs_add_up_and_graph_is_real_fx():
    m = load_model("tiny_gpt")
    tl = fx.trace_layer(m, "block", Variant(2, True))
    names = [n.name for n in tl.graph_module.graph.nodes]
    assert names[0] == "x" and "attention" in names and "tp_in1" in names
    assert sum(n.fwd_flops for n in tl.nodes) == tl.cost.fwd_flops
    assert sum(n.bwd_flops for n in tl.nodes) == tl.cost.bwd_flops
    assert {n.kind for n in tl.nodes if n.target.startswith("tp_")} == {"comm"}


def test_json_round_trip_and_deterministic(tmp_path):
    m = load_model("tiny_moe")
    g = fx.build_layer_graph_fx(m, 2)
    g.write(tmp_path / "g.json")
    assert LayerGraph.read(tmp_path / "g.json").to_dict() == g.to_dict()
    fx.clear_caches()
    assert fx.build_layer_graph_fx(m, 2).to_dict() == g.to_dict()


# ---- a model given only as a Hugging Face config.json ------------------------------------------


def test_hf_config_gives_the_builtin_graph():
    spec = model_spec_from_hf_config(HF_TINY_LLAMA, seq_len=256, parallel_variants={
        "tp": [1], "sp": [False], "ep": [1], "cp": [1]})
    builtin = load_model("tiny_llama")
    assert spec.name == "tiny_llama_hf"
    a, b = fx.build_layer_graph_fx(spec).to_dict(), fx.build_layer_graph_fx(builtin).to_dict()
    assert a.pop("model") == "tiny_llama_hf" and b.pop("model") == "tiny_llama"
    assert a == b


def test_hf_transformers_block_exported_on_meta():
    pytest.importorskip("transformers")
    from nest.graph.hf_config import trace_hf_block

    spec = model_spec_from_hf_config(HF_TINY_LLAMA, seq_len=256)
    tr = trace_hf_block(HF_TINY_LLAMA, seq_len=256)
    ours = _block(spec)
    assert tr.num_params == ours.params
    assert tr.fwd_flops == ours.fwd_flops  # causal attention halved on both sides
    assert tr.model_num_params == fx.total_params(spec)


@pytest.mark.parametrize("name,variant", [
    ("tiny_llama", Variant()), ("tiny_llama", Variant(2, True, 1, 2)),
    ("tiny_moe", Variant(2, False, 2, 1)), ("tiny_gpt", Variant(2, True, 1, 1))])
def test_full_recompute_bytes_equal_the_traced_checkpoint(name, variant):
    """The whole-block checkpoint's saved bytes, computed from the block's input, equal the ones
    measured by running the block under torch.utils.checkpoint (the pass they replace)."""
    import torch.fx

    from nest.graph import torch_models as tm

    m = load_model(name)
    if variant.key not in {v.key for v in cf.variants_of(m)}:
        variant = cf.variants_of(m)[-1]  # the widest the tiny model declares
    module, inputs = tm.build_layer(m, "block", variant)
    gm = torch.fx.GraphModule(module, fx._Tracer().trace(module))
    exclude = fx._excluded(module)
    traced = fx.full_bytes_traced(gm, inputs, exclude)
    assert fx.full_recompute_bytes(inputs, exclude) == traced > 0
    assert fx.trace_layer(m, "block", variant).cost.act_bytes["full"] == traced
