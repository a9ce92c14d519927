"""Topology builders -> cluster levels, against the catalog files and hand calculations."""

import networkx as nx
import numpy as np
import pytest

from nest.network.collectives import path_bandwidth
from nest.network.topology import (
    cluster_dict,
    fat_tree_levels,
    graph_levels,
    level_matrix,
    max_flow,
    nested_grouping,
    spine_leaf_levels,
    torus_graph,
    torus_levels,
    tree_graph,
    write_cluster_yaml,
)
from nest.spec.catalog import cluster_from_dict, config_dir, load_cluster, read_yaml


def _catalog_levels(name):
    return read_yaml(config_dir() / "clusters" / f"{name}.yaml")["levels"]


def test_fat_tree_and_spine_leaf_reproduce_the_catalog():
    assert fat_tree_levels() == _catalog_levels("tpuv4_fattree")
    assert spine_leaf_levels() == _catalog_levels("h100_spineleaf")
    # 2:1 by hand: a leaf's 32 devices x 12.5 GB/s share 2 uplinks of 100 GB/s
    assert spine_leaf_levels()[2]["oversubscription"] == 32 * 12.5 / (2 * 100)


@pytest.mark.parametrize("cluster, fanouts, up, num_top", [
    ("tpuv4_fattree", [8, 4, 32], [450, 100, 400], 1),
    ("h100_spineleaf", [8, 4, 32], [450, 12.5, 2 * 100 / 32], 2),
])
def test_graph_of_the_paper_clusters_gives_the_catalog_levels(cluster, fanouts, up, num_top):
    # links into the node switch 1 us, into the leaf 1.5 us, into the top 1 us: 2, 5, 7 us
    G = tree_graph(fanouts, up, [1.0, 1.5, 1.0], num_top=num_top)
    names = [lv["name"] for lv in _catalog_levels(cluster)]
    r = graph_levels(G, names=names)
    # a graph has line rates; NCCL efficiencies are the catalog's own statement
    line = [{k: x for k, x in lv.items() if k != "efficiency"} for lv in _catalog_levels(cluster)]
    assert r.levels == line
    assert not r.warnings
    # the effective per-device bandwidth equals what the collectives price
    d = read_yaml(config_dir() / "clusters" / f"{cluster}.yaml")
    c = cluster_from_dict({**d, "levels": line}, cluster, None)
    assert r.effective_GBps == pytest.approx([path_bandwidth(c, k) / 1e9 for k in range(3)])


def _two_level_tree():
    """Two leaf switches of 3 devices (25 GB/s, 1 us links) under one spine (40 GB/s, 2 us),
    devices named and listed so that the leaves interleave."""
    G = nx.Graph()
    leaf_of = {"g0": "A", "g1": "B", "g2": "A", "g3": "B", "g4": "A", "g5": "B"}
    for d in leaf_of:
        G.add_node(d, kind="device")
    for sw in ("A", "B", "spine"):
        G.add_node(sw, kind="switch")
    for d, leaf in leaf_of.items():
        G.add_edge(d, leaf, bandwidth=25e9, latency=1e-6)
    G.add_edge("A", "spine", bandwidth=40e9, latency=2e-6)
    G.add_edge("B", "spine", bandwidth=40e9, latency=2e-6)
    return G


def test_two_level_tree_levels_and_pair_matrix():
    r = graph_levels(_two_level_tree(), names=["leaf", "spine"])
    assert r.levels == [
        {"name": "leaf", "devices_per_group": 3, "bandwidth_GBps": 25.0, "latency_us": 2.0,
         "oversubscription": 1.0},
        # 3 devices share one 40 GB/s uplink: 13.3 GB/s each; 2 x 1 us + 2 x 2 us
        {"name": "spine", "devices_per_group": 6, "bandwidth_GBps": pytest.approx(40 / 3, rel=1e-5),
         "latency_us": 6.0, "oversubscription": 1.0},
    ]
    # leaves made contiguous: g0 g2 g4 | g1 g3 g5
    assert r.device_order == ["g0", "g2", "g4", "g1", "g3", "g5"]
    expected = np.array([[-1, 0, 0, 1, 1, 1],
                         [0, -1, 0, 1, 1, 1],
                         [0, 0, -1, 1, 1, 1],
                         [1, 1, 1, -1, 0, 0],
                         [1, 1, 1, 0, -1, 0],
                         [1, 1, 1, 0, 0, -1]])
    assert np.array_equal(r.level_matrix, expected)
    assert np.array_equal(level_matrix(r.levels, 6), expected)


def test_nested_grouping_finds_the_permutation_and_rejects_bad_matrices():
    # devices 0..5; the true groups are {0, 2, 4} and {1, 3, 5}
    same = np.array([[(a % 2) == (b % 2) for b in range(6)] for a in range(6)])
    L = np.where(same, 0, 1)
    np.fill_diagonal(L, -1)
    g = nested_grouping(L)
    assert g.devices_per_group == [3, 6] and not g.contiguous
    assert g.order == [0, 2, 4, 1, 3, 5]
    assert np.array_equal(L[np.ix_(g.order, g.order)], level_matrix([{"devices_per_group": 3},
                                                                     {"devices_per_group": 6}], 6))
    assert nested_grouping(level_matrix([{"devices_per_group": 2}, {"devices_per_group": 4}],
                                        4)).contiguous
    bad = np.array([[-1, 0, 1], [0, -1, 0], [1, 0, -1]])  # 0~1, 1~2 but not 0~2 at level 0
    with pytest.raises(ValueError, match="not a nested grouping"):
        nested_grouping(bad)
    uneven = np.array([[-1, 0, 1], [0, -1, 1], [1, 1, -1]])  # groups of 2 and 1
    with pytest.raises(ValueError, match="sizes"):
        nested_grouping(uneven)


def test_torus_hop_classes():
    t = torus_levels((4, 4, 4), link_GBps=50.0, hop_latency_us=1.0, base_latency_us=1.0)
    assert [lv["devices_per_group"] for lv in t.levels] == [2, 4, 8, 64]
    assert t.hop_diameters == [1, 2, 3, 6]  # 4x4x4 with wrap-around: 2 + 2 + 2 hops
    assert [lv["latency_us"] for lv in t.levels] == [2.0, 3.0, 4.0, 7.0]
    # full 4x4x4 torus: bisection 2 x 4 x 4 links for 32 devices per side -> one link each
    assert [lv["bandwidth_GBps"] for lv in t.levels] == [50.0] * 4
    # device ids are block-major: every 2x2x2 tile is 8 consecutive ids
    assert {c for c in t.device_order[:8]} == {(x, y, z) for x in (0, 1) for y in (0, 1)
                                                for z in (0, 1)}
    # a 4x4x4 cube inside a 16^3 pod has no wrap-around: 16 cut links for 32 devices
    pod = torus_levels((16, 16, 16), link_GBps=50.0, block_shapes=[(4, 4, 4), (16, 16, 16)])
    assert [lv["devices_per_group"] for lv in pod.levels] == [64, 4096]
    assert [lv["bandwidth_GBps"] for lv in pod.levels] == [25.0, 12.5]
    assert pod.hop_diameters == [9, 24]


def test_torus_bisection_matches_graph_max_flow():
    G = torus_graph((4, 4), link_GBps=10.0)
    t = torus_levels((4, 4), link_GBps=10.0)
    half = set(t.device_order[:8])
    flow = max_flow(G, half, set(G) - half) / 1e9
    assert flow == pytest.approx(t.levels[-1]["bandwidth_GBps"] * 8)  # 2 x 4 links x 10 GB/s


def test_cluster_yaml_round_trip(tmp_path):
    d = cluster_dict("fat_tree_copy", "tpuv4_like", fat_tree_levels(), sizes=[64, 128],
                     source="nest.network.topology.fat_tree_levels defaults")
    path = tmp_path / "fat_tree_copy.yaml"
    write_cluster_yaml(path, d, comment="generated")
    back = cluster_from_dict(read_yaml(path), str(path), 64)
    ref = load_cluster("tpuv4_fattree", 64)
    assert back.levels == ref.levels
    with pytest.raises(ValueError, match="devices_per_group"):
        cluster_dict("bad", "tpuv4_like", fat_tree_levels()[::-1], source="x")


@pytest.mark.parametrize("dims, unit", [((4, 4, 12), None), ((8, 8, 12), (4, 4, 4)),
                                        ((12, 12, 12), (4, 4, 4)), ((6, 6, 6), None),
                                        ((3, 5, 7), None)])
def test_torus_default_blocks_nest_on_sides_that_are_not_powers_of_two(dims, unit):
    """TPU v4 slices of 4x4x12, 8x8x12 or 12x12x12 chips (whole 4x4x4 cubes) and odd tori:
    every default block divides the next and the last is the torus (the builder refused them:
    doubling 4x4x4 gave 4x4x8, which does not divide 4x4x12). Power-of-two tori keep their
    doubling blocks."""
    t = torus_levels(dims, optical_block=unit)
    shapes = t.block_shapes
    assert shapes[-1] == dims
    for lo, hi in zip(shapes, shapes[1:]):
        assert lo != hi and all(h % x == 0 for x, h in zip(lo, hi))
    if unit is not None:
        assert unit in shapes
    assert len(t.device_order) == len(set(t.device_order)) == int(np.prod(dims))
    assert torus_levels((16, 16, 16), optical_block=(4, 4, 4)).block_shapes == [
        (2, 1, 1), (2, 2, 1), (2, 2, 2), (4, 4, 4), (8, 8, 8), (16, 16, 16)]


def test_odd_torus_bisection_is_the_graph_cut():
    """An odd side is cut too: a 3x5 torus's level share is the max-flow across the cut
    perpendicular to its side of 5 (2 wrapped links on each of 3 rings) over half the devices,
    not the six-link share of a block with no bisection (it was 187.5 GB/s, 4 links x 46.875)."""
    G = torus_graph((3, 5), link_GBps=10.0)
    t = torus_levels((3, 5), link_GBps=10.0)
    side = {c for c in G if c[1] in (0, 1)}
    flow = max_flow(G, side, set(G) - side) / 1e9
    assert flow == pytest.approx(6 * 10.0)
    assert t.levels[-1]["bandwidth_GBps"] == pytest.approx(flow / (15 / 2))
    assert t.levels[-1]["ring_bandwidth_GBps"] == pytest.approx(4 * 10.0)


def test_a_disconnected_device_is_named():
    """A graph file with a device no link reaches was refused as "the devices are not all
    connected", leaving the user to search a thousand-node file; the error now names the
    unreachable devices and the first device they have no route to."""
    G = _two_level_tree()
    G.add_node("gpu_lost", kind="device")
    with pytest.raises(ValueError, match="'gpu_lost'.*no route.*'g0'"):
        graph_levels(G, names=["leaf", "spine"])
    G.add_node("lost2", kind="device")
    with pytest.raises(ValueError, match="2 devices.*'gpu_lost', 'lost2'"):
        graph_levels(G, names=["leaf", "spine"])
    H = nx.Graph()  # the lost device listed first: still the one named
    H.add_node("gpu_lost", kind="device")
    H.add_nodes_from(_two_level_tree().nodes(data=True))
    H.add_edges_from(_two_level_tree().edges(data=True))
    with pytest.raises(ValueError, match="device 'gpu_lost' has no route to device 'g0'"):
        graph_levels(H, names=["leaf", "spine"])
