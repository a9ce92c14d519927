"""The expert-parallel all-to-all of a level-aware dispatcher (HybridEP / DeepEP) -> alpha-beta line.

Megatron-Core's flex token dispatcher with the HybridEP backend (Megatron-Bridge
`moe_token_dispatcher_type="flex"`, `moe_flex_dispatcher_backend="hybridep"`; the kernels are
NVIDIA's Hybrid-EP in DeepEP, deepseek-ai/DeepEP branch hybrid-ep, its "Hybrid-EP
Implementation Guide", section "Hybrid-EP Kernels") moves tokens in two levels: "Similar to DeepEP, Hybrid-EP first performs
IB communication between peer GPUs, then each rank distributes the received inter-node data
locally". A token crosses the inter-node network once per remote NVLink domain that holds at
least one of its experts, and is fanned out to those experts' ranks over NVLink there; the
combine pre-reduces inside the domain before it sends ("Intra-node ... Pre-reduces data within
node before sending to peers"), so it moves the same bytes back. DeepSeek-V3's report
(DeepSeek-AI 2024, arXiv:2412.19437, section 3.2.2) describes the same scheme for DeepEP: "IB
to the GPUs with the same in-node index on the target nodes ... then forwarded via NVLink".
Megatron-Core dispatches BF16 with it ("HybridEP dispatcher does not support fp8 dispatch now",
megatron/core/transformer/moe/fused_a2a.py).

Bytes, per rank and per byte of the flat all-to-all's buffer S = T k h b (T tokens, top-k, hidden
h, b bytes; the layer graph's ep all_to_all): routing draws k of E experts per token, spread
evenly over the n ranks of N domains of m ranks (E / N experts per domain). Megatron-Bridge's
benchmarks force balance with random router logits (`moe_router_force_load_balancing`,
megatron/core/transformer/moe/router.py apply_random_logits), so every k-subset is equally
likely and a remote domain receives the token with probability

    P = 1 - C(E - E/N, k) / C(E, k)                                   (`domain_hit_probability`)

The token's copies go out T (N - 1) P h b = S (N - 1) P / k bytes over the inter-domain levels
(the flat all-to-all sends S (n - m) / n there: k (N - 1) / N copies of each token), and each
rank writes (m - 1) / m of S over NVLink: its own tokens' copies to the other m - 1 ranks, and the
remote tokens it received as the peer, forwarded. With the flat all-to-all's convention
(nest.network.collectives._all_to_all: every byte that leaves a device passes its level-0 link;
the bytes to peers meeting at level >= l share level l's), the fractions of S are

    level 0:   (m - 1) / m + (N - 1) P / k
    level l>0: D_l P / k     (D_l: remote domains meeting the device at level >= l)

and the time is max_l fraction_l S / bw(l) + (n - 1) alpha, one line as for the flat all-to-all,
with bw(0) NCCL's NVLink rate and, for l > 0, the line rate times the share of it that HybridEP's
kernels reach across nodes (`rdma_factor`; not NCCL's efficiency: these are not NCCL's kernels).
Within one domain (N = 1), or with domains of unequal size (HybridEP needs the ranks per NVLink
domain to divide the group), it is the flat all-to-all.
"""

from __future__ import annotations

from functools import lru_cache
from math import comb

import numpy as np

from nest.network.collectives import coefficients, path_bandwidth, span_level
from nest.spec.catalog import ClusterSpec

DISPATCHERS = ("alltoall", "hybridep")  # TrainingSettings.moe_dispatcher

# HybridEP's published H100 figures (deepseek-ai/DeepEP branch hybrid-ep, its README_Hybrid-EP.md,
# "Performance Results", H100 Platform: 4,096 tokens per rank, hidden 7,168, top-8, random uniform
# router, 8 local experts, ranks 16 / 32 / 64 = 2 / 4 / 8 nodes of 8), the rows Megatron-Core runs:
# the Torch API (what fused_a2a.py calls, permutation included), BF16 dispatch (Megatron-Core
# dispatches BF16 with HybridEP) and combine, 16 SMs (TransformerConfig.moe_hybridep_num_sms'
# default; 8 SMs reach as much at 2 nodes, so more SMs would not be faster). GB/s, keyed by nodes:
HYBRID_EP_H100_GBPS = {2: (54.47, 53.35), 4: (47.36, 52.53), 8: (41.24, 46.57)}
# The figures are "algorithm bandwidth": the benchmark divides by the time the bytes sent to every
# node a token's experts live on, its own node included (its test utils.py, count_rdma_send_from_routing_map:
# "To align with the implementation in the DeepEP, we do not set the local node map to zeros";
# the legacy test_internode.py of DeepEP counts so too, and DeepEP's own README calls its figures
# "logical bandwidth" that "contains local rank traffic"). Only the (N - 1) / N of them bound for
# other nodes cross the NIC (N nodes, all alike under uniform routing), so the NIC-carried bytes move
# at figure x (N - 1) / N. The figures' line: the README names no NIC; a DGX H100's is CX-7 400 Gb/s
# InfiniBand, 50 GB/s per GPU (DeepEP's own H800 figures state that NIC and "~50 GB/s").
HYBRID_EP_LINE_GBPS = 50.0


def rdma_factor(nodes: int) -> float:
    """The share of the cross-node line rate HybridEP's dispatch and combine reach on the bytes
    that cross it, N nodes: mean(dispatch, combine) x (N - 1) / N / 50 GB/s from the published
    H100 row of the largest published N <= nodes (2 nodes: 0.539; 4: 0.749; 8 and more: 0.768).
    Checked against DeepEP's normal kernels on H800 (docs/networks.md)."""
    if nodes < 2:
        raise ValueError(f"hybrid all-to-all: rdma_factor of {nodes} node(s): nothing crosses nodes")
    key = max(k for k in HYBRID_EP_H100_GBPS if k <= nodes)
    disp, comb_ = HYBRID_EP_H100_GBPS[key]
    return (disp + comb_) / 2 * (key - 1) / key / HYBRID_EP_LINE_GBPS


def domain_hit_probability(experts: int, top_k: int, domains: int) -> float:
    """P(a token's k distinct, uniformly drawn experts of E include one of a given domain's
    E / N): 1 - C(E - E/N, k) / C(E, k)."""
    if domains <= 1:
        return 1.0
    if experts % domains:
        raise ValueError(f"hybrid all-to-all: {domains} domains do not divide {experts} experts")
    return 1.0 - comb(experts - experts // domains, top_k) / comb(experts, top_k)


def level_fractions(cluster: ClusterSpec, group: tuple[int, ...], experts: int,
                    top_k: int) -> tuple[float, ...] | None:
    """Bytes per level per byte of S that cross the busiest end device's link at each level up
    to the group's span (module docstring); None where the dispatch is the flat all-to-all (one
    domain, or domains of unequal size)."""
    m0 = cluster.levels[0].devices_per_group
    dom = np.asarray(group, dtype=np.int64) // m0
    _, sizes = np.unique(dom, return_counts=True)
    if len(sizes) <= 1 or (sizes != sizes[0]).any():
        return None
    n_dom, m = len(sizes), int(sizes[0])
    p = domain_hit_probability(experts, top_k, n_dom)
    top = span_level(cluster, group)
    out = np.zeros(top + 1)
    for a in (group[0], group[-1]):  # the end devices bound the symmetric cases
        lv = np.array([cluster.level_of(a, b) for b in group if b != a])
        f = [(m - 1) / m + (n_dom - 1) * p / top_k]
        f += [np.count_nonzero(lv >= level) / m * p / top_k for level in range(1, top + 1)]
        out = np.maximum(out, f)
    return tuple(float(x) for x in out)


@lru_cache(maxsize=4096)
def hybrid_all_to_all(cluster: ClusterSpec, group: tuple[int, ...], experts: int,
                      top_k: int) -> tuple[float, float]:
    """(alpha, beta) of the level-aware dispatch (or combine) on a sorted group, per byte of the
    flat all-to-all's buffer; the flat all-to-all's line where `level_fractions` is None."""
    frac = level_fractions(cluster, group, experts, top_k)
    if frac is None:
        return coefficients(cluster, "all_to_all", group)[0]
    nodes = len(np.unique(np.asarray(group, dtype=np.int64) // cluster.levels[0].devices_per_group))
    cross = rdma_factor(nodes)
    beta = max(f / (path_bandwidth(cluster, lv) if lv == 0 else
                    path_bandwidth(cluster, lv, line=True) * cross) for lv, f in enumerate(frac))
    top = span_level(cluster, group)
    return (len(group) - 1) * cluster.levels[top].latency_s, float(beta)
