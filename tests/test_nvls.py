"""NVLink SHARP lines (nest.network.nvls) by hand: NVLS over one whole NVLink domain, NVLS-Tree
over whole domains on several nodes, the ring elsewhere; only where the hardware has it; scaled
with the cluster's communication; absent from the network-blind view."""

import pytest

from nest.network.collectives import coefficients, collective_time, flattened
from nest.network.nvls import NVLS_LATENCY_S
from nest.spec.catalog import load_cluster

S = 8e9


def test_nvls_lines_by_hand():
    c = load_cluster("dgx_h100_superpod", 64)
    B = 1.07 * 450e9  # h100_sxm.yaml nvls_efficiency x the node level's 450 GB/s
    assert c.levels[0].nvls_bytes_per_s == pytest.approx(B)
    assert all(lv.nvls_bytes_per_s == 0 for lv in c.levels[1:])
    # one whole node: NVLS, 2 (n-1)/n S / B + 25 us (faster than the ring at 8 GB)
    t = collective_time(c, "all_reduce", tuple(range(8)), S)
    assert t == pytest.approx(2 * 7 / 8 * S / B + NVLS_LATENCY_S, rel=1e-12)
    # two whole nodes, even apart: NVLS-Tree, per NIC min(2 x 48 GB/s, NCCL's 57.7) x 8 NICs,
    # alpha 25 us + 2 log2(2) x the su level's 5 us
    group = tuple(range(8)) + tuple(range(24, 32))
    t = collective_time(c, "all_reduce", group, S)
    assert t == pytest.approx(2 * 15 / 16 * S / (8 * 57.7e9) + NVLS_LATENCY_S + 2 * 5e-6,
                              rel=1e-12)
    # four whole nodes: NVLS-Tree's 8 x 45.5 loses to the ring's 8 x 48 (NCCL runs the ring)
    n = 32
    t = collective_time(c, "all_reduce", tuple(range(n)), S)
    assert t == pytest.approx(2 * (n - 1) / n * S / (8 * 48e9) + 2 * (n - 1) * 5e-6, rel=1e-12)
    # no NVLS line for a part of a node, a node not whole, or all-gather
    for g in (tuple(range(4)), tuple(range(15)), tuple(range(1, 9))):
        assert all(b != pytest.approx(2 * (len(g) - 1) / len(g) / B, rel=1e-6, abs=0)
                   for _, b in coefficients(c, "all_reduce", g))
    ag = collective_time(c, "all_gather", tuple(range(8)), S)
    assert ag == pytest.approx(7 / 8 * S / (450e9 * 0.82) + 7 * 2e-6, rel=1e-12)


def test_only_where_the_switch_reduces_scaled_and_not_blind():
    a100 = load_cluster("dgx_a100", 64)  # NVSwitch gen 2: no NVLink SHARP
    assert all(lv.nvls_bytes_per_s == 0 for lv in a100.levels)
    tpu = load_cluster("tpuv4_torus", 64)
    assert all(lv.nvls_bytes_per_s == 0 for lv in tpu.levels)
    c = load_cluster("dgx_h100_superpod", 64)
    node = tuple(range(8))
    t = collective_time(c, "all_reduce", node, S)
    assert collective_time(c.with_comm_scale(2.0), "all_reduce", node, S) == pytest.approx(2 * t)
    blind = flattened(c)  # the network-blind view: the ring over NVLink
    assert all(lv.nvls_bytes_per_s == 0 for lv in blind.levels)
    assert collective_time(blind, "all_reduce", node, S) == pytest.approx(
        2 * 7 / 8 * S / (450e9 * 0.82) + 14 * 2e-6, rel=1e-12)
    # GB200: the whole 72-GPU rack gets 0.94 x 900 GB/s, a tray or 8 GPUs of it the ring
    nvl = load_cluster("gb200_nvl72", 144)
    assert nvl.levels[0].nvls_bytes_per_s == pytest.approx(0.94 * 900e9)
    assert min(b for _, b in coefficients(nvl, "all_reduce", tuple(range(8)))) == pytest.approx(
        2 * 7 / 8 / (900e9 * 0.9), abs=0)
