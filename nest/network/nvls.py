"""Device group x cluster -> alpha-beta lines of NCCL's NVLink SHARP all-reduce (NVLS, NVLS-Tree).

NVLink SHARP (NVLS) reduces in the NVLink switch (NVSwitch gen 3 on HGX H100 / H200, the NVLink
switch of B200 / GB200 NVL72; NCCL 2.17 release notes for NVLS, 2.18 for NVLS-Tree). NCCL prices
every algorithm with its tuning model and runs the fastest (src/graph/tuning.cc,
ncclTopoTuneModel; read at NCCL master, 2026); `nest.network.collectives` takes the same minimum
over its lines, these among them. In NCCL-tests' bus bandwidth (busbw = algbw x 2 (n-1)/n), the
tuning model gives an NVLS all-reduce a bus bandwidth that does not depend on n (per channel:
the switch graph's bandwidth x the generation's NVLS efficiency x 2, "AllReduce pipelines two
operations"), and NVLS-Tree (NVLS reduce-scatter inside each node, a tree across nodes between
the GPUs that own the same shard, each on its own NIC, NVLS all-gather) the smaller of that and
the tree's rate across nodes: the node's NICs together, twice that on two nodes (the tree is one
pair, each NIC sends its shard once; on more nodes NCCL's double binary tree sends it twice).
So, with B the NVLS bus bandwidth (`NetworkLevel.nvls_bytes_per_s`: the hardware file's
`nvls_efficiency` x the NVLink domain's per-direction link bandwidth) and k devices per domain:

    NVLS       one whole NVLink domain:    2 (n-1)/n S / B + alpha_nvls
    NVLS-Tree  N >= 2 whole domains:       2 (n-1)/n S / min(B, k min(c_N, bw(top) x f_N))
                                           + alpha_nvls + 2 floor(log2 N) alpha(top)
                                           (f_N = 2 on two nodes, else 1)

(bw(top): `path_bandwidth` at the level joining the domains, the slowest tree edge; alpha_nvls:
the tuning model's NVLS latency over NVLink, 25 us; c_N: the tuning model's cap on an NVLS-Tree
channel, the hardware file's `nvls_tree_cap_GBps`, fitted by NCCL's authors: on Hopper it keeps
NVLS-Tree below the ring across three or more nodes, so NCCL runs the ring there, as measured:
NVLS on or off gives the same ~320 GB/s on 4 nodes of 8 x H100, NVIDIA/nccl issue 1221.) Only all-reduce: the tuning model gives an
NVLS all-gather / reduce-scatter (k-1)/k of the link rate where the all-reduce gets 2, below the
ring, and across nodes it needs IB SHARP (CollNet), which the clusters here do not have. A group
that is part of a domain keeps the ring: NCCL's NVLS on fewer GPUs has fewer channels ((k-1)/k
of the rate in its model), which the published numbers used here do not measure.
Every line is a function of the group's size and `collectives.patterns` (a sorted group is one
whole domain iff it sits in one and has k members; every domain is whole iff each run of one
domain has k members), so the per-pattern caches stay exact.
"""

from __future__ import annotations

import numpy as np

NVLS_LATENCY_S = 25e-6  # NCCL tuning.cc, hwLatencies[NVLINK][NVLS][SIMPLE] (and NVLS_TREE)


def nvls_lines(cluster, kind: str, group: tuple[int, ...], top: int,
               top_bytes_per_s: float) -> list[tuple[float, float]]:
    """The NVLS / NVLS-Tree line for an all-reduce over the sorted `group` spanning level `top`
    (whose per-device bandwidth is `top_bytes_per_s`), or [] where NCCL has none."""
    lv0 = cluster.levels[0]
    B = lv0.nvls_bytes_per_s
    n = len(group)
    if kind != "all_reduce" or B <= 0 or n <= 1:
        return []
    k = lv0.devices_per_group
    steps = 2 * (n - 1) / n
    alpha = NVLS_LATENCY_S * cluster.comm_scale
    if top == 0:
        return [(alpha, steps / B)] if n == k else []
    if n % k:  # whole domains only: n is a multiple of k (a cheap exit before the ids' test)
        return []
    dom = np.asarray(group, dtype=np.int64) // k
    first = np.flatnonzero(np.insert(dom[1:] != dom[:-1], 0, True))
    if (np.diff(first, append=n) != k).any():  # a domain only partly in the group
        return []
    nodes = len(first)
    per_nic = top_bytes_per_s * (2 if nodes == 2 else 1)
    cap = cluster.hardware.nvls_tree_cap_bytes_per_s[0 if nodes == 2 else 1] / cluster.comm_scale
    busbw = min(B, k * (min(per_nic, cap) if cap > 0 else per_nic))
    alpha += 2 * (nodes.bit_length() - 1) * cluster.levels[top].latency_s
    return [(alpha, steps / busbw)]
