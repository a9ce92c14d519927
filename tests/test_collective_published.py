"""The shipped current clusters' collective prices against published collective bandwidths
(within 15%): NCCL all-reduce inside a GB200 NVL72 rack and across racks over the rails, NVLS
inside an H100 / H800 node and NVLS-Tree over two, the rail-optimised DGX H100 SuperPOD across
nodes, and the TPU v4 pod's all-reduce bandwidth.

Bus bandwidth as NCCL-tests reports it (nccl-tests doc/PERFORMANCE.md): algbw = S / t, and
busbw = algbw x 2 (n - 1) / n for all-reduce, x (n - 1) / n for all-gather / reduce-scatter.
The measurements are independent of the cluster files' inputs except where said.
"""

import pytest

from nest.network.collectives import coefficients, collective_time, flattened
from nest.spec.catalog import load_cluster


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
    """NVLS all-reduce over one 8-GPU NVSwitch board. DGX H100: 479.72 GB/s at 8 GiB (Voltage Park
    DGX H100, aigatech/vpbenchmarking, NCCL 2.24.3: the cluster of the 4-node check below);
    H800 (NVLink 200 GB/s per direction, alibaba_hpn_dualplane): 215 GB/s (NVIDIA/nccl issue
    1374). h100_sxm.yaml's 1.07 comes from a third measurement (nccl issue 2140). All-gather
    has no NVLS line (NCCL's model gives it (k-1)/k of the link rate where all-reduce gets 2):
    the ring, 370 GB/s (nccl-tests issue 212, tests/test_network.py)."""
    h100 = load_cluster("dgx_h100_rail_superpod", 256)
    assert busbw(h100, range(8)) == pytest.approx(479.72e9, rel=0.15)
    assert busbw(h100, range(8)) == pytest.approx(479.72e9, rel=0.01)
    assert busbw(h100, range(8), "all_gather") == pytest.approx(370e9, rel=0.01)
    # a part of the board keeps the ring (NVLS is priced over a whole NVLink domain only)
    assert busbw(h100, range(4)) == pytest.approx(369e9, rel=0.01)
    h800 = load_cluster("alibaba_hpn_dualplane", 1024)
    assert busbw(h800, range(8)) == pytest.approx(215e9, rel=0.15)
    assert busbw(h800, range(8)) == pytest.approx(215e9, rel=0.01)


def test_nvls_tree_on_two_nodes():
    """Two whole nodes of 8 x H100 (16 GPUs), 8 x 400 Gb/s RoCE each, NCCL 2.19.3: all-reduce
    busbw 330 GB/s with NVLS off (the ring), 430 with it on, NCCL's NVLS-Tree (NVIDIA/nccl
    issue 1221, 2024-03-13; sizes 4-8 GiB). The model: min(NVLS 481, 8 NICs x min(2 x 48, the
    tuning model's 57.7 per channel)) = 461 GB/s (+7%); the ring alone would give 384."""
    c = load_cluster("dgx_h100_rail_superpod", 256)
    model = busbw(c, range(16))
    assert model == pytest.approx(430e9, rel=0.15)
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


# Every published all-reduce bus bandwidth of 4 nodes x 8 H100 with 8 x 400 Gb/s NICs each that
# we found (8 GiB or the largest size run); the model is compared with each, none dropped.
FOUR_H100_NODES = {
    # Voltage Park DGX H100 (aigatech/vpbenchmarking, NCCL 2.24.3, InfiniBand NDR)
    "vpbenchmarking": 331e9,
    # 8 x 400 Gb/s RoCE, NCCL 2.19.3, 4-8 GiB, "same busbw 320GB" with NVLS on or off
    # (github.com/NVIDIA/nccl issue 1221, 2024-03-13)
    "nccl issue 1221": 320e9,
    # NVIDIA's reference figure for multi-node DGX H100 ring all-reduce, ~380 GB/s (a GTC 2024
    # slide quoted in NVIDIA/nccl issue 1649; the DGX chart quoted in NVIDIA/nccl-tests issue
    # 309, 2025-05-20: "380GB/s in a multi-host")
    "NVIDIA reference": 380e9,
}


def test_rail_superpod_across_nodes():
    """DGX H100, one 400 Gb/s NDR NIC per GPU on its rail. Across nodes on one rail (GPU 3 of
    32 nodes: a data-parallel group under tp = 8): NCCL's ring runs at one NIC's rate, "for
    NDR @ 400Gbps you should see 46-48GB/s per NIC" (NCCL maintainer, github.com/NVIDIA/
    nccl-tests issue 290, 2025-03-03); the model gives 50 x 0.96 = 48 GB/s.

    All 8 GPUs of 4 nodes (32 GPUs): the model gives 381 GB/s (the ring, all 8 NICs of a node
    at the per-NIC rate at once, 8 x 48 = 384, less 62 steps of 5 us at 8 GiB). The published
    figures (`FOUR_H100_NODES`) disagree with each other by 19%: NVIDIA's reference ~380 GB/s
    (the model: +0.3%) and two field clusters at 331 (+15.1%) and 320 GB/s (+19%). The same
    Voltage Park cluster's all-gather, 323.5 GB/s, is as far below the model's 381 (+17.8%; its
    NICs at ~41 GB/s each when all 8 run); a Dell HGX H100 with 8 x 400 Gb/s reached 250 GB/s on two
    nodes (nccl-tests issue 309). So the gap is in the clusters, not in a term the model lacks
    at this size: the latency steps are 0.8% at 8 GiB; NCCL runs the Simple protocol there
    (LL / LL128 only for small buffers); the rail-ordered ring leaves each node on the sender's
    own rail, so PXN adds no NVLink hop; and no published source puts the per-NIC rate of 8
    busy CX-7 NICs below the maintainers' 46-48 GB/s. Against the two field clusters this
    check is outside the 15% band; it is stated, not fitted (a rail efficiency fitted to them
    would move every H100 price across nodes).

    NVLink SHARP does not close it: on 3 or more nodes NCCL's tuning model caps NVLS-Tree at
    45.5 GB/s per channel (8 x 45.5 = 364 < the ring's 384), so NCCL runs the ring there, and
    measurements agree: NVLS on or off gives the same ~320 GB/s on 4 nodes of 8 x H100
    (NVIDIA/nccl issue 1221). The model picks the ring too. Past ~32 nodes the ring's 2 (n-1)
    latency steps make NVLS-Tree the faster line, as NCCL's maintainers say ("rings degrade
    at scale", nccl issue 1649)."""
    c = load_cluster("dgx_h100_rail_superpod", 256)
    rail = [8 * k + 3 for k in range(32)]
    assert busbw(c, rail) == pytest.approx(47e9, rel=0.15)
    assert busbw(c, rail) == pytest.approx(48e9, rel=0.01)
    model = busbw(c, range(32))
    assert model == pytest.approx(381e9, rel=0.01)
    assert 8 * 46e9 <= model <= 8 * 48e9
    off = {k: model / v - 1 for k, v in FOUR_H100_NODES.items()}
    assert off["NVIDIA reference"] == pytest.approx(0.003, abs=0.003)  # within 15%
    assert off["vpbenchmarking"] == pytest.approx(0.151, abs=0.002)  # outside, stated
    assert off["nccl issue 1221"] == pytest.approx(0.19, abs=0.003)  # outside, stated
    assert busbw(c, range(32), "all_gather") / 323.5e9 - 1 == pytest.approx(0.178, abs=0.003)
    nvls_tree = 8 * 45.5e9
    assert model > nvls_tree  # the ring wins on 4 nodes
    assert busbw(c, range(256)) == pytest.approx(nvls_tree, rel=0.01)  # NVLS-Tree on 32 nodes


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
