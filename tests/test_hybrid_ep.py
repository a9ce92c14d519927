"""The level-aware expert-parallel dispatch (nest.network.hybrid_ep): the probability that a token
reaches a remote NVLink domain by brute force, the bytes per level by hand, the flat all-to-all
inside one domain, and the setting reaching the stage's ep terms."""

from itertools import combinations
from math import comb

import pytest

from nest.network.collectives import coefficients, path_bandwidth
from nest.network.hybrid_ep import domain_hit_probability, hybrid_all_to_all, level_fractions
from nest.spec.catalog import load_cluster


@pytest.mark.parametrize("experts,k,domains", [(8, 2, 2), (8, 3, 4), (12, 4, 3), (16, 1, 2)])
def test_domain_hit_probability_brute_force(experts, k, domains):
    """Every k-subset of E experts equally likely (random router logits): the share of subsets
    with an expert in the last domain's E / N."""
    per = experts // domains
    subsets = list(combinations(range(experts), k))
    hit = sum(any(e >= experts - per for e in s) for s in subsets) / len(subsets)
    assert domain_hit_probability(experts, k, domains) == pytest.approx(hit, abs=1e-12)


def test_qwen3_ep16_two_dgx_nodes_by_hand():
    """Qwen3-30B-A3B (128 experts, top-8) at ep 16 over two DGX H100 nodes: a token reaches the
    other node with P = 1 - prod_{i<8} (64 - i) / (128 - i) (0.99690); per byte of the flat
    buffer S the device sends 7/8 (NVLink fan-out) + P / 8 (once per remote node) and P / 8
    crosses InfiniBand, where the flat all-to-all sends 8/16 of S there."""
    c = load_cluster("dgx_h100_superpod", 16)
    g = tuple(range(16))
    p = 1.0
    for i in range(8):
        p *= (64 - i) / (128 - i)
    p = 1 - p
    assert p == pytest.approx(0.99690, abs=1e-5)
    f0, f1 = level_fractions(c, g, 128, 8)
    assert (f0, f1) == pytest.approx((7 / 8 + p / 8, p / 8), rel=1e-12)
    alpha, beta = hybrid_all_to_all(c, g, 128, 8)
    bw0, bw1 = path_bandwidth(c, 0), path_bandwidth(c, 1)
    cross = 50e9 * 0.5391  # the 400 Gb/s line x HybridEP's share of it at 2 nodes (below)
    assert beta == pytest.approx(max(f0 / bw0, f1 / cross), rel=1e-12)
    flat_alpha, flat_beta = coefficients(c, "all_to_all", g)[0]
    assert flat_beta == pytest.approx(0.5 / bw1, rel=1e-12)
    assert alpha == flat_alpha
    # the cross-node bytes fall ~4x, but at about half the rate NCCL reaches: ~2.25x faster
    assert flat_beta / beta == pytest.approx(0.5 / bw1 / (f1 / cross), rel=1e-12)
    assert 2.2 < flat_beta / beta < 2.3


def test_rdma_factor_from_the_published_h100_rows_by_hand():
    """HybridEP's H100 Torch-API rows at 16 SMs (BF16 dispatch, combine; GB/s) are algorithm
    bandwidth over the bytes to every node a token reaches, its own included: the NIC carries
    (N - 1) / N of them. 2 nodes: (54.47 + 53.35) / 2 x 1/2 / 50 = 0.5391; 4: (47.36 + 52.53) / 2
    x 3/4 / 50 = 0.7491750; 8: (41.24 + 46.57) / 2 x 7/8 / 50 = 0.7683375; between and beyond,
    the largest published node count below."""
    from nest.network.hybrid_ep import rdma_factor

    want = {2: 0.5391, 3: 0.5391, 4: 0.749175, 6: 0.749175, 8: 0.7683375, 32: 0.7683375}
    for nodes, f in want.items():
        assert rdma_factor(nodes) == pytest.approx(f, rel=1e-12)
    with pytest.raises(ValueError, match="1 node"):
        rdma_factor(1)


def test_priced_cross_node_dispatch_is_bytes_over_line_times_factor():
    """Qwen3-30B-A3B's dispatch at ep 16 over two DGX H100 (4,096 tokens of a micro-batch, top-8,
    hidden 2,048, BF16): the flat buffer S = 4096 x 8 x 2048 x 2 bytes; a token crosses
    InfiniBand once, with P = 0.99690, so T P h b = S P / 8 bytes leave over the NIC, priced at
    the cluster file's 50 GB/s line x 0.5391 (26.96 GB/s; NCCL's 0.96 does not apply). NVLink's
    share S (7/8 + P/8) at 450 x 0.82 GB/s is faster, so the NIC part is the time: about 0.62 ms
    of bytes plus 15 x 5 us of latency."""
    c = load_cluster("dgx_h100_superpod", 16)
    s_bytes = 4096 * 8 * 2048 * 2
    p = 1 - comb(64, 8) / comb(128, 8)
    cross_s = 4096 * p * 2048 * 2 / (50e9 * 0.5391)
    nvlink_s = s_bytes * (7 / 8 + p / 8) / (450e9 * 0.82)
    assert nvlink_s < cross_s
    alpha, beta = hybrid_all_to_all(c, tuple(range(16)), 128, 8)
    assert beta * s_bytes == pytest.approx(cross_s, rel=1e-12)
    assert alpha == pytest.approx(15 * 5e-6, rel=1e-12)
    assert alpha + beta * s_bytes == pytest.approx(0.6205e-3 + 75e-6, rel=2e-3)


@pytest.mark.parametrize("nodes,dispatch_gbps,combine_gbps", [(2, 54.47, 53.35), (4, 47.36, 52.53),
                                                                (8, 41.24, 46.57)])
def test_the_published_benchmark_reproduces(nodes, dispatch_gbps, combine_gbps):
    """The benchmark's own setting priced by the model (hidden 7,168, 4,096 tokens, top-8, 8 local
    experts per rank, BF16): its time is the bytes the benchmark counts, T x h x 2 per node a
    token reaches including its own (N x P of them), over the mean of the dispatch and combine
    figures. A different road from the factor's: the model counts NIC bytes (N - 1) P per token
    and the NVLink level too (which must not bind here)."""
    n = 8 * nodes
    c = load_cluster("dgx_h100_superpod", n)
    experts = 8 * n
    p = 1 - comb(experts - experts // nodes, 8) / comb(experts, 8)
    counted = 4096 * nodes * p * 7168 * 2
    want = counted / ((dispatch_gbps + combine_gbps) / 2 * 1e9)
    _, beta = hybrid_all_to_all(c, tuple(range(n)), experts, 8)
    assert beta * 4096 * 8 * 7168 * 2 == pytest.approx(want, rel=1e-12)


def test_one_domain_or_uneven_domains_is_the_flat_all_to_all():
    """Inside one node nothing crosses InfiniBand: the flat line. Domains of unequal size: HybridEP
    needs the ranks per NVLink domain to divide the group, so the flat line too."""
    c = load_cluster("dgx_h100_superpod", 32)
    for g in (tuple(range(8)), tuple(range(2, 6)), (0, 1, 2, 8)):
        assert level_fractions(c, g, 128, 8) is None
        assert hybrid_all_to_all(c, g, 128, 8) == coefficients(c, "all_to_all", g)[0]


def test_setting_reaches_the_stage_terms():
    """The Qwen3 ep-16 published row priced with moe_dispatcher alltoall / hybridep: the ep
    all-to-all's total over the step shrinks by the ratio of the two lines' slopes (the buffers
    are MBs, so alpha is < 1% of each), and compute is untouched."""
    from nest.fidelity import published_runs as P

    row = next(r for r in P.load_runs() if r["id"] == "bridge260401_qwen3_30b_a3b_16gpu_fp8")
    assert row["moe_dispatcher"] == "hybridep"
    flat = P.evaluate_member({**row, "moe_dispatcher": "alltoall"})
    hyb = P.evaluate_member(row)
    assert hyb.predicted_s < flat.predicted_s
    with pytest.raises(Exception, match="moe_dispatcher"):
        P.training_for({**row, "moe_dispatcher": "deepep"})


def test_hybridep_drops_the_sender_side_permutation():
    """Under HybridEP the dispatch kernel gathers tokens as it sends and the combine kernel sums
    a token's expert outputs as it receives (nest.costs.table.FUSED_INTO_DISPATCH): a MoE layer's
    forward and backward lose exactly the priced times of moe_permute and moe_combine (the
    receiving side's local sort stays), its full recomputation the forward ones, and a layer
    without experts is unchanged. (The host floor per operator is set to 0: the tiny model's
    layers are host-bound.)"""
    from dataclasses import replace

    from nest.costs.profiled import price_op
    from nest.costs.table import MOE_SORT, layer_times
    from nest.graph import build_graph
    from nest.spec.catalog import load_hardware, load_model

    hw = replace(load_hardware("h100_sxm"), host_fwd_s_per_op=0.0, host_bwd_s_per_op=0.0)
    g = build_graph(load_model("tiny_moe"), 1, "torch_fx")
    v = next(v for v in g.variants if v.ep > 1 and v.tp == 1)
    moe = next(la.costs[v.key] for la in g.layers
               if any(op.name == "moe_permute" for op in la.costs[v.key].ops))
    flat = layer_times(hw, moe, None)
    hyb = layer_times(hw, moe, None, dispatcher="hybridep")
    fused = [price_op(hw, op, None) for op in moe.ops if op.name in ("moe_permute", "moe_combine")]
    assert len(fused) == 2 and MOE_SORT in hyb.op_sources
    assert hyb.fwd_s == pytest.approx(flat.fwd_s - sum(t.fwd_s for t in fused), rel=1e-12)
    assert hyb.bwd_s == pytest.approx(flat.bwd_s - sum(t.bwd_s for t in fused), rel=1e-12)
    assert hyb.recompute_s["full"] == pytest.approx(
        flat.recompute_s["full"] - sum(t.fwd_s for t in fused), rel=1e-12)
    dense = g.layers[0].costs[v.key]
    assert layer_times(hw, dense, None, dispatcher="hybridep") == layer_times(hw, dense, None)


def test_dispatcher_setting_is_checked():
    """config/training.yaml's schema takes alltoall / hybridep and names the key otherwise; the
    default is Megatron-Core's alltoall dispatcher."""
    from nest.common.errors import SpecError
    from nest.spec.catalog import validate
    from nest.spec.settings import load_training

    assert load_training().moe_dispatcher == "alltoall"
    for ok in ("alltoall", "hybridep"):
        validate({"moe_dispatcher": ok}, "training", "training.yaml")
    with pytest.raises(SpecError, match="moe_dispatcher"):
        validate({"moe_dispatcher": "deepep"}, "training", "training.yaml")


def test_export_launches_the_priced_dispatcher():
    """A plan priced with HybridEP exports Megatron-LM's flex dispatcher with that backend; the
    default exports the all-to-all dispatcher."""
    from nest.graph.layer_graph import Variant
    from nest.interfaces.export import to_megatron
    from nest.problem.evaluate import make_problem
    from nest.problem.space import make_plan

    pr = make_problem("tiny_moe", "tiny_cluster", 8)
    L = pr.graph.num_layers
    plan = make_plan(pr, "h", Variant(1, False, 2), 2, 2, [(0, 2), (3, L - 1)], [0, 0],
                     ["none", "none"], "replica_major")
    for dispatcher, want in (("alltoall", "alltoall"), ("hybridep", "flex")):
        exp = to_megatron(plan, pr.with_training(moe_dispatcher=dispatcher))
        a = exp.args
        assert a[a.index("--moe-token-dispatcher-type") + 1] == want
        assert ("--moe-flex-dispatcher-backend" in a) == (dispatcher == "hybridep")
