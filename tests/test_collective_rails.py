"""The rail-optimised DGX H100 SuperPOD across nodes against every published NCCL ring figure
of 8 x H100 nodes with one 400 Gb/s NIC per GPU that we found, and its per-NIC rate from first
principles. config/clusters/dgx_h100_rail_superpod.yaml prices each NIC at 0.96 x 50 GB/s (the
nominal) and states 0.92 as the low end of the band (`rail_efficiency_low`,
ClusterSpec.at_band_low_end): both are NCCL maintainers' figures ("around 48GB/s from
each CX7 NIC", "46-48GB/s per NIC"), neither is fitted to the measurements below.

Bus bandwidth as NCCL-tests reports it (nccl-tests doc/PERFORMANCE.md): algbw = S / t, busbw =
algbw x 2 (n - 1) / n for all-reduce, x (n - 1) / n for all-gather / reduce-scatter. Only large
messages are compared (8 GiB, or the largest size a source ran), where the ring's latency steps
are under 3% of the time.
"""

import numpy as np
import pytest

from nest.common.inputs import read_yaml
from nest.network.collectives import _multi_ring, collective_time
from nest.spec.catalog import cluster_from_dict, config_dir, load_cluster

GB = 1e9


def busbw(cluster, group, kind="all_reduce", S=8e9):
    n = len(group)
    return (2 if kind == "all_reduce" else 1) * (n - 1) / n * S / collective_time(
        cluster, kind, tuple(group), S)


def ring_busbw(cluster, n, kind, S=8 * 2**30):
    """NCCL's ring over the first n devices: the ring line alone (NVLS off on two nodes)."""
    (a, b), = _multi_ring(cluster, kind, np.arange(n)[None, :], np.array([1]))
    return (2 if kind == "all_reduce" else 1) * (n - 1) / n * S / (a + b * S)


def clusters(n=256):
    """The SuperPOD at its nominal per-NIC rate and at its band's low end."""
    c = load_cluster("dgx_h100_rail_superpod", n)
    return c, c.at_band_low_end()


# The same fabric as the cluster file: 8 x H100 SXM per node, InfiniBand NDR, one ConnectX-7 per
# GPU. (source, collective, nodes, busbw). Measurements:
SAME_FABRIC = [
    # Voltage Park's H100 SXM5 nodes, InfiniBand NDR, NCCL 2.24.3, 8 GiB, default algorithm
    # (the ring on 4 nodes) (github.com/aigatech/vpbenchmarking); the same run's all-gather
    ("vpbenchmarking", "all_reduce", 4, 330.93e9),
    ("vpbenchmarking", "all_gather", 4, 323.53e9),
    # Dell XE9680, 8 x CX-7 400 Gb/s InfiniBand, NCCL 2.26.2, after tuning: "4 nodes on 32
    # GPU-NIC pairs ... max busbw can get 365.84 GB/s" (github.com/NVIDIA/nccl-tests issue 309)
    ("nccl-tests issue 309", "all_reduce", 4, 365.84e9),
    # NVIDIA's multi-node DGX H100 all-reduce chart, ~380 GB/s (GTC 2024 session S62129,
    # www.nvidia.com/en-us/on-demand/session/gtc24-s62129/; quoted in NVIDIA/nccl issue 1649 and
    # nccl-tests issue 309: "380GB/s in a multi-host"; node count not given: compared on 4)
    ("NVIDIA GTC 2024 S62129", "all_reduce", 4, 380e9),
]
# An expectation, not a measurement: "around 48GB/s from each CX7 NIC at 400Gbps ... up to
# ~396GB/s with the RING protocol" (NCCL maintainer, github.com/NVIDIA/nccl-tests issue 319)
MAINTAINERS_RING = 396e9
# Other fabrics, compared for information, not the cluster file's: 8 x 400 Gb/s RoCE (NVIDIA/
# nccl issue 1221, NCCL 2.19.3, 4-8 GiB: "same busbw 320GB" with NVLS on or off on 4 nodes,
# 330 on 2 nodes with NVLS off); an "H100 cluster" whose NICs, size and NCCL version are not
# stated, reduce-scatter "just like 360, 345, 320" on 4 / 8 / 16 nodes (NVIDIA/nccl issue 1229).
OTHER_FABRIC = [
    ("nccl issue 1221 (RoCE)", "all_reduce", 4, 320e9),
    ("nccl issue 1221 (RoCE), NVLS off", "all_reduce", 2, 330e9),
    ("nccl issue 1229 (NICs not stated)", "reduce_scatter", 4, 360e9),
    ("nccl issue 1229 (NICs not stated)", "reduce_scatter", 8, 345e9),
    ("nccl issue 1229 (NICs not stated)", "reduce_scatter", 16, 320e9),
]


def test_ndr_per_nic_rate_from_first_principles():
    """What one NDR NIC can carry, from its specification, against the cluster file's rates.
    Line: 4 lanes of 53.125 GBd PAM4 (106.25 Gb/s), RS-FEC (544, 514) and 256b/257b
    transcoding leave 100 Gb/s of data per lane, 400 Gb/s = 50 GB/s per direction. Packets:
    NCCL's RDMA writes go as 4,096-byte MTU packets with LRH 8 + BTH 12 + ICRC 4 + VCRC 2 bytes
    (InfiniBand Architecture Specification vol. 1; the 16-byte RETH once per write of >= 128
    KiB is under 0.01%): 4096 / 4122 of the line, 49.7 GB/s. PCIe Gen5 x16 between the GPU and
    its NIC (one PCIe switch, GPUDirect RDMA): 32 GT/s x 16 x 128/130 = 63.0 GB/s, of which
    256-byte TLPs (16-byte header, 2 sequence, 4 LCRC, 4 framing) carry 57.2: it does not bind.
    So the wire caps a NIC at 49.7 GB/s; the nominal 48 (0.96) is 96.6% of it, the band's low
    end 46 (0.92) 92.6%. The same NIC under NCCL's ring reached 49.2 GB/s on GB200 (3 racks x 8
    GPUs, 393.66 GB/s over each rack's 8 NICs, NVIDIA/nccl issue 1801), within 1% of the wire:
    nothing in the NIC or the protocol holds an 8-NIC node below the nominal."""
    lane = 2 * 53.125e9 * 514 / 544 * 256 / 257
    assert lane == pytest.approx(100e9, rel=1e-4)
    line = 4 * lane / 8
    wire = line * 4096 / (4096 + 8 + 12 + 4 + 2)
    assert wire == pytest.approx(49.68e9, rel=1e-3)
    pcie = 32e9 * 16 * 128 / 130 / 8 * 256 / (256 + 16 + 2 + 4 + 4)
    assert pcie == pytest.approx(57.2e9, rel=2e-3) and pcie > wire
    nominal, low = clusters()
    assert nominal.levels[1].bytes_per_s == pytest.approx(48e9)
    assert low.levels[1].bytes_per_s == pytest.approx(46e9)
    assert nominal.levels[1].bytes_per_s / wire == pytest.approx(0.966, abs=0.001)
    assert low.levels[1].bytes_per_s / wire == pytest.approx(0.926, abs=0.001)
    gb200_per_nic = 393.66e9 / 8
    assert nominal.levels[1].bytes_per_s < gb200_per_nic < wire
    assert gb200_per_nic / wire > 0.99
    # the band is on the rails only: NVLink and every other level are the same at both ends
    assert nominal.levels[0] == low.levels[0]
    assert [lv.devices_per_group for lv in nominal.levels] == [
        lv.devices_per_group for lv in low.levels]
    assert any("scale-out band" in n and "4.3% longer" in n for n in nominal.notes)


def test_rail_superpod_across_nodes():
    """DGX H100, one 400 Gb/s NDR NIC per GPU on its rail. Across nodes on one rail (GPU 3 of
    32 nodes: a data-parallel group under tp = 8): NCCL's ring runs at one NIC's rate, "for
    NDR @ 400Gbps you should see 46-48GB/s per NIC" (NCCL maintainer, github.com/NVIDIA/
    nccl-tests issue 290, 2025-03-03); the model gives 48 GB/s, 46 at the band's low end.

    All 8 GPUs of 4 nodes (32 GPUs): 381 GB/s (the ring, all 8 NICs of a node at the per-NIC
    rate at once, 8 x 48 = 384, less 62 steps of 5 us at 8 GiB), 365 at the low end. NCCL's
    own tuning model puts the ring at the NICs' line rate with no efficiency term at any node
    count (`nccl_tuning_ring`: 396 GB/s here), above both. The latency steps are 0.8% at 8 GiB;
    NCCL runs the Simple protocol there (LL / LL128 only for small buffers); the rail-ordered
    ring leaves each node on the sender's own rail, so PXN adds no NVLink hop.

    NVLink SHARP: on 3 or more nodes NCCL's tuning model caps NVLS-Tree at 45.5 GB/s per
    channel (8 x 45.5 = 364 < the ring's 384), so NCCL runs the ring there, and measurements
    agree: NVLS on or off gives the same ~320 GB/s on 4 nodes of 8 x H100 (NVIDIA/nccl issue
    1221). The model picks the ring too (at the low end the two lines are within 0.4%). Past
    ~32 nodes the ring's 2 (n-1) latency steps make NVLS-Tree the faster line, as NCCL's
    maintainers say ("rings degrade at scale", nccl issue 1649)."""
    c, low = clusters()
    rail = [8 * k + 3 for k in range(32)]
    assert busbw(c, rail) == pytest.approx(48e9, rel=0.01)
    assert busbw(low, rail) == pytest.approx(46e9, rel=0.01)
    model = busbw(c, range(32))
    assert model == pytest.approx(381e9, rel=0.01)
    assert busbw(low, range(32)) == pytest.approx(365e9, rel=0.01)
    nccl = nccl_tuning_ring(4)
    assert nccl == pytest.approx(396e9, rel=0.005) and model < nccl
    nvls_tree = 8 * 45.5e9
    assert model > nvls_tree  # the ring wins on 4 nodes
    assert busbw(c, range(256)) == pytest.approx(nvls_tree, rel=0.01)  # NVLS-Tree on 32 nodes


def nccl_tuning_ring(nodes, S=8 * 2**30, nics=8, per_node=8):
    """NCCL's own tuning model (src/graph/tuning.cc, Hopper, ring, Simple protocol) for an
    all-reduce: bus bandwidth nChannels x bwInter = the NICs' line rate (net bw = Mb/s / 8000:
    50 GB/s per NDR NIC), no efficiency below it at any node count; latency base 8.4 us, 14 us
    per inter-node step, max(3.4 us NVLink, 3 x 1 us net overhead) per other step, x 1.4 for the
    ring's plateau on several nodes (ncclTopoGetAlgoTime)."""
    n = nodes * per_node
    steps, inter = 2 * (n - 1), 2 * (nodes - 1)
    lat = 1.4 * (8.4 + inter * 14.0 + (steps - inter) * 3.4) * 1e-6
    algbw = nics * 50e9 * n / steps
    return 2 * (n - 1) / n * S / (lat + S / algbw)


def offsets(cluster, rows):
    return [ring_busbw(cluster, 8 * nodes, kind) / v - 1 for _, kind, nodes, v in rows]


def test_every_published_ring_figure_against_the_band():
    """Every figure above, none dropped, against the model at 8 GiB at both ends of its band.

    Same fabric (`SAME_FABRIC`, 4 measurements): 323.5 to 380 GB/s, a spread of 17.5% (not the
    30% of a fabric whose measurements disagree). The nominal is within 15% of the tuned Dell
    cluster (+4.2%) and NVIDIA's chart (+0.3%), and of the maintainers' ~396 (-3.7%), and above
    Voltage Park's two by 15.2% and 17.8%: outside 15%, stated. The low end is within 15% of all
    four (+10.4%, +13.0%, -0.1%, -3.8%; the maintainers' -7.7%). So every measurement of this
    fabric lies within 15% of the band, and none above its nominal: the field runs its NICs at
    40-46 GB/s, NVIDIA at ~47.5, the wire allows 49.7.

    Other fabrics (`OTHER_FABRIC`, 5 figures), for information: the nominal is +5.9% to +19.1%
    above them, the low end +1.5% to +14.2%, also within 15% of every one.

    Why the nominal stays 0.96, not 0.92 (which would put the nominal itself within 15% of every
    figure): the wire allows 49.7 GB/s, NCCL's ring reached 49.2 on the same NIC (GB200), NVIDIA
    measures ~47.5 on DGX H100, the maintainers expect ~48; 0.92 is the low end of their range,
    and picking it because it passes these checks would be fitting by choice. The band's low
    end carries the field clusters instead (`nest plan` prints it; the robustness analysis's
    communication factor 1.3 spans its 4.3%)."""
    c, low = clusters()
    nom, lo = offsets(c, SAME_FABRIC), offsets(low, SAME_FABRIC)
    assert nom == pytest.approx([0.152, 0.178, 0.042, 0.003], abs=0.002)
    assert lo == pytest.approx([0.104, 0.130, -0.001, -0.038], abs=0.002)
    assert all(min(abs(a), abs(b)) <= 0.15 for a, b in zip(nom, lo))  # within 15% of the band
    assert sum(abs(x) <= 0.15 for x in nom) == 2  # the nominal alone: Dell and NVIDIA
    values = [v for *_, v in SAME_FABRIC]
    assert max(values) / min(values) - 1 == pytest.approx(0.175, abs=0.001)
    four = ring_busbw(c, 32, "all_reduce"), ring_busbw(low, 32, "all_reduce")
    assert [x / MAINTAINERS_RING - 1 for x in four] == pytest.approx([-0.037, -0.077], abs=0.002)
    nom_o, lo_o = offsets(c, OTHER_FABRIC), offsets(low, OTHER_FABRIC)
    assert nom_o == pytest.approx([0.191, 0.159, 0.059, 0.097, 0.167], abs=0.002)
    assert lo_o == pytest.approx([0.142, 0.111, 0.015, 0.052, 0.119], abs=0.002)
    assert max(lo_o) <= 0.15 and min(lo_o) > 0
    # per NIC: every measurement below the nominal
    per_nic = [v / 8 for *_, v in SAME_FABRIC + OTHER_FABRIC]
    assert max(per_nic) < 48e9 and min(per_nic) == 40e9
    # the NVLS-off ring on two whole nodes is the same ring line the model has under NVLS-Tree
    assert ring_busbw(c, 16, "all_reduce") < busbw(c, range(16))


def test_band_low_end_is_the_file_at_that_efficiency():
    """The low end is the cluster the file would give with rail_efficiency = the low end (one
    rule, `ClusterSpec.at_band_low_end`, checked against the builder); a file without a band is
    its own low end; errors name the file and key."""
    from nest.common.errors import SpecError

    d = read_yaml(config_dir() / "clusters" / "dgx_h100_rail_superpod.yaml")
    net = {k: v for k, v in d["network"].items() if k != "rail_efficiency_low"}
    rebuilt = cluster_from_dict({**d, "network": {**net, "rail_efficiency": 0.92}}, "x", 256)
    c = load_cluster("dgx_h100_rail_superpod", 256)
    assert c.scale_out_low == pytest.approx(0.92 / 0.96)
    for a, b in zip(c.at_band_low_end().levels, rebuilt.levels, strict=True):
        assert a.bytes_per_s == pytest.approx(b.bytes_per_s, rel=1e-12)
        assert (a.latency_s, a.devices_per_group, a.oversubscription) == (
            b.latency_s, b.devices_per_group, b.oversubscription)
    assert c.at_band_low_end().name == "dgx_h100_rail_superpod_low"
    plain = cluster_from_dict({**d, "network": net}, "x.yaml", 256)
    assert plain.at_band_low_end() is plain
    assert not any("scale-out band" in n for n in plain.notes)
    bad = {**d, "network": {**d["network"], "rail_efficiency_low": 0.97}}
    with pytest.raises(SpecError, match=r"x.yaml: key 'network.rail_efficiency_low': 0.97 "
                                        r"exceeds rail_efficiency 0.96"):
        cluster_from_dict(bad, "x.yaml", 256)
    levels = load_cluster("dgx_h100_superpod", 256)
    assert levels.at_band_low_end() is levels


def test_nest_plan_prints_the_plan_at_the_band_low_end():
    """`nest plan` / `evaluate` (uncertainty.lines_for) re-evaluate the plan with the cluster at
    its band's low end: slower, by at most the band's 4.3% (only the rails change), and only on
    a cluster that states a band."""
    from nest.fidelity.uncertainty import lines_for, network_band_line
    from nest.planners.registry import run_planner
    from nest.problem.evaluate import evaluate, make_problem

    pr = make_problem("llama2_7b", "dgx_h100_rail_superpod", 64)
    plan = run_planner("manual", pr).plan
    ev = evaluate(plan, pr.with_mbs(plan.mbs))
    low = evaluate(plan, pr.with_mbs(plan.mbs).with_cluster(pr.cluster.at_band_low_end()))
    assert ev.time_per_batch_s <= low.time_per_batch_s <= ev.time_per_batch_s * 0.96 / 0.92
    line = network_band_line(ev, pr.with_mbs(plan.mbs))
    assert f"time {low.time_per_batch_s:.4f} s" in line
    assert any("scale-out band" in x for x in lines_for(ev, pr.with_mbs(plan.mbs)))
    flat = make_problem("llama2_7b", "dgx_h100_superpod", 64)
    ev2 = evaluate(run_planner("manual", flat).plan, flat)
    assert network_band_line(ev2, flat) == ""
