"""The shipped current clusters' collective prices against published collective bandwidths
(within 15%): NCCL all-reduce inside a GB200 NVL72 rack and across racks over the rails, NVLS
inside an H100 / H200 / H800 node and NVLS-Tree over two, and the TPU v4 pod's all-reduce
bandwidth. The rail-optimised DGX H100 SuperPOD's rings across nodes: tests/test_collective_rails.py.

Bus bandwidth as NCCL-tests reports it (nccl-tests doc/PERFORMANCE.md): algbw = S / t, and
busbw = algbw x 2 (n - 1) / n for all-reduce, x (n - 1) / n for all-gather / reduce-scatter.
The measurements are independent of the cluster files' inputs except where said.
"""

import pytest

from nest.common.inputs import read_yaml
from nest.network.collectives import coefficients, collective_time, flattened
from nest.spec.catalog import cluster_from_dict, config_dir, load_cluster


def busbw(cluster, group, kind="all_reduce", S=8e9):
    n = len(group)
    return (2 if kind == "all_reduce" else 1) * (n - 1) / n * S / collective_time(
        cluster, kind, tuple(group), S)


def test_nvl72_rack_all_reduce():
    """A full GB200 NVL72 rack, 72 GPUs, NCCL-tests all_reduce_perf at 8 GiB: busbw 834.6 GB/s
    out of place, 846.8 in place (CoreWeave, github.com/coreweave/nccl-tests pull request 43,
    "full nvl72 rack run", 2025-02-20). NCCL runs NVLS there (NVLink SHARP in the NVLink 5
    switch, nest.network.nvls); gb200.yaml's NVLS efficiency (0.94 of 900 GB/s) comes from a
    different measurement (8 x B300, NVIDIA/nccl issue 2140), the ring's (0.9) from another
    (811 GB/s on 8 GPUs over multi-node NVLink, see gb200_nvl72.yaml)."""
    c = load_cluster("gb200_nvl72", 72)
    model = busbw(c, range(72), S=8 * 2**30)
    assert model == pytest.approx(834.6e9, rel=0.15)
    assert model == pytest.approx(834.6e9, rel=0.02)  # +1.2%
    # the NVLS line, 0.94 x 900 GB/s less its 25 us at 8 GiB; the ring would give ~794
    assert model == pytest.approx(0.94 * 900e9, rel=0.002) and model < 0.94 * 900e9
    for kind in ("all_gather", "reduce_scatter"):  # no NVLS line: the ring, 900 x 0.9
        assert busbw(c, range(72), kind, S=8 * 2**30) == pytest.approx(810e9, rel=0.03)


def test_nvls_inside_one_node():
    """NVLS all-reduce over one 8-GPU NVSwitch board at 8 GiB, every one-node figure we found:
    H100 479.72 GB/s (Voltage Park's H100 SXM5 nodes, aigatech/vpbenchmarking, NCCL 2.24.3: the
    cluster of the 4-node rows below); 478.87 (Azure ND H100 v5, in place, NCCL 2.18.5,
    Azure/AI-benchmarking-guide ND_H100_v5_results.md); "480 GB/s" (a Dell XE9680, NVIDIA/
    nccl-tests issue 309). H200 (the same NVSwitch gen 3 / NVLink 4): 479.98 (Azure ND H200 v5,
    NCCL 2.20.5, the same guide), priced with h200_sxm.yaml on the same fabric. H800 (NVLink 200
    GB/s per direction, alibaba_hpn_dualplane): 215 GB/s (NVIDIA/nccl issue 1374).
    h100_sxm.yaml's 1.07 comes from another measurement (nccl issue 2140). All-gather has no
    NVLS line (NCCL's model gives it (k-1)/k of the link rate where all-reduce gets 2): the
    ring, 370 GB/s (nccl-tests issue 212, tests/test_network.py)."""
    h100 = load_cluster("dgx_h100_rail_superpod", 256)
    for published in (479.72e9, 478.87e9, 480e9):
        assert busbw(h100, range(8)) == pytest.approx(published, rel=0.15)
        assert busbw(h100, range(8)) == pytest.approx(published, rel=0.01)
    assert busbw(h100, range(8), "all_gather") == pytest.approx(370e9, rel=0.01)
    # a part of the board keeps the ring (NVLS is priced over a whole NVLink domain only)
    assert busbw(h100, range(4)) == pytest.approx(369e9, rel=0.01)
    d = read_yaml(config_dir() / "clusters" / "dgx_h100_rail_superpod.yaml")
    h200 = cluster_from_dict({**d, "hardware": "h200_sxm"}, "H200 on the H100 SuperPOD", 256)
    assert h200.hardware.name != h100.hardware.name
    # h200_sxm.yaml's NVLS efficiency is h100_sxm.yaml's (fitted on H100s): on the H200 figure,
    # which it was not fitted on, +0.23% (Azure ND H200 v5, Azure/AI-benchmarking-guide
    # Azure_Results/ND_H200_v5_results.md, NVLS in place at 8 GiB)
    assert busbw(h200, range(8), S=8 * 2**30) / 479.98e9 - 1 == pytest.approx(0.0024, abs=3e-4)
    h800 = load_cluster("alibaba_hpn_dualplane", 1024)
    assert busbw(h800, range(8)) == pytest.approx(215e9, rel=0.15)
    assert busbw(h800, range(8)) == pytest.approx(215e9, rel=0.01)


def test_nvls_tree_on_two_nodes():
    """Two whole nodes of 8 x H100 (16 GPUs), 8 x 400 Gb/s NICs each, all-reduce, NCCL's
    NVLS-Tree (its default there): 430 GB/s (RoCE, NCCL 2.19.3, sizes 4-8 GiB; 330 with NVLS
    off, the ring: `RING_ACROSS_NODES`; NVIDIA/nccl issue 1221, 2024-03-13) and "470 GB/s"
    (a Dell XE9680, 8 x CX-7 400 Gb/s InfiniBand, NCCL 2.26.2, after tuning; NVIDIA/nccl-tests
    issue 309, 2025). The model: min(NVLS 481, 8 NICs x min(2 x 48, the tuning model's 57.7 per
    channel)) = 461 GB/s (+7%, -1.9%); the ring alone would give 383."""
    c = load_cluster("dgx_h100_rail_superpod", 256)
    model = busbw(c, range(16))
    for published, off in ((430e9, 0.072), (470e9, -0.019)):
        assert model == pytest.approx(published, rel=0.15)
        assert model / published - 1 == pytest.approx(off, abs=0.002)
    assert model == pytest.approx(8 * 57.7e9, rel=0.01)
    ring = busbw(c, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14])  # not whole: no NVLS
    assert ring < 384e9 < model


@pytest.mark.parametrize("per_rack, published", [(4, 196.72e9), (8, 393.66e9)])
def test_nvl72_racks_joined_over_the_rails(per_rack, published):
    """GB200 NVL72, all-reduce over 3 racks with `per_rack` GPUs in each (NVL partitions on
    different racks, "only IB communication between them"), NCCL 2.27.3 ring, 16 GiB: busbw
    196.72 GB/s for 4 GPUs per rack (12 GPUs), 393.66 for 8 per rack (24 GPUs)
    (github.com/NVIDIA/nccl issue 1801, 2025-08-06; NCCL's tree reached 234.43 and 485.68).
    One 400 Gb/s NIC per GPU: the ring leaves each rack once per channel, so the rack's NICs
    add up (`_multi_ring`): 4 x 48 = 192, 8 x 48 = 384 GB/s. With 4 per rack the hierarchical
    algorithm (reduce-scatter on NVLink, the racks' all-reduce on a quarter of the buffer)
    prices faster, 208 GB/s: 6% above NCCL's ring, 11% below its tree."""
    c = load_cluster("gb200_nvl72", 216)
    group = [r * 72 + i for r in range(3) for i in range(per_rack)]
    model = busbw(c, group, S=16 * 2**30)
    assert model == pytest.approx(published, rel=0.15)
    assert model >= per_rack * 48e9 * 0.99  # at least the ring over the rack's NICs


def test_tpu_v4_pod_all_reduce():
    """Cloud TPU v4 documentation (system architecture table): "All-reduce bandwidth per Pod
    1.1 PB/s" for 4,096 chips = 268.6 GB/s per chip; "Bisection bandwidth per Pod 24 TB/s".
    A vendor figure, asymptotic in the buffer size, not a measured run: compared at a 1 TB
    buffer, where the per-step latency (a bound here, see `_block_rings`) no longer counts.
    The torus builder prices a whole-block all-reduce at 6 links x 46.875 GB/s (rings along
    all three dimensions); the bisection share alone (11.7 GB/s per chip over the pod) would
    be 23x too slow for an all-reduce."""
    c = load_cluster("tpuv4_torus")
    model = busbw(c, range(4096), S=1e12)
    assert model == pytest.approx(1.1e15 / 4096, rel=0.15)
    assert c.levels[-1].bytes_per_s * 4096 / 2 == pytest.approx(24e12, rel=1e-4)  # bisection


def test_block_rings_only_for_whole_blocks():
    """The torus ring line prices a group that is one whole block and nothing else: a strided
    group (every other chip of a cube) keeps the level-wise price, and two whole cubes anywhere
    cost the same (the price is a function of size and pattern, as the caches assume)."""
    c = load_cluster("tpuv4_torus", 256)
    cube = tuple(range(64))
    assert coefficients(c, "all_reduce", cube) == coefficients(c, "all_reduce",
                                                               tuple(range(128, 192)))
    a, b = min(coefficients(c, "all_reduce", cube), key=lambda ab: ab[1])
    assert b == pytest.approx(2 * 63 / 64 / 281.25e9)
    strided = tuple(range(0, 128, 2))
    assert min(x[1] for x in coefficients(c, "all_reduce", strided)) > 2 * 63 / 64 / 100e9
    # all-to-all keeps the bisection share: a whole cube's traffic crosses its bisection
    (_, b2), = coefficients(c, "all_to_all", cube)
    assert b2 > 1 / 281.25e9
    # the network-blind view has one flat bandwidth: no block prices faster than it
    flat = flattened(c)
    assert all(lv.ring_bytes_per_s == 0 for lv in flat.levels)
    # (the multi-ring prices the pair hop and the hop out of each pair on their own links:
    # 2 x 46.875 GB/s, a third of the block's six links)
    assert min(x[1] for x in coefficients(flat, "all_reduce", cube)) == pytest.approx(
        2 * 63 / 64 / (2 * c.levels[0].bytes_per_s), rel=0.01)
