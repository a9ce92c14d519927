"""Cluster files that describe their network by a named builder or a graph file
(nest.network.fabric), the shipped topologies, and the cards without measured profiles."""

import json
import math

import networkx as nx
import pytest
import yaml

from nest.common.errors import SpecError
from nest.network import fabric
from nest.network.collectives import collective_time, p2p_time, path_bandwidth
from nest.network.topology import graph_levels, torus_levels
from nest.spec.catalog import cluster_from_dict, config_dir, load_cluster, load_hardware, read_yaml


def _write(tmp_path, d, name="c.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    return p


def _line(levels):
    return [{k: v for k, v in lv.items() if k != "efficiency"} for lv in levels]


# -- level file vs the same cluster as a graph file ---------------------------------------------


def test_graph_file_prices_as_its_level_file():
    lv, gr = load_cluster("h100_spineleaf", 128), load_cluster("h100_spineleaf_graph", 128)
    assert gr.network == "graph" and lv.network == "levels"
    assert gr.levels == lv.levels and gr.num_devices == lv.num_devices
    groups = [tuple(range(8)), tuple(range(0, 128, 8)), tuple(range(0, 128, 4)),
              tuple(range(32)), tuple(range(16, 80))]
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        for g in groups:
            assert collective_time(gr, kind, g, 3e8) == collective_time(lv, kind, g, 3e8)
    assert p2p_time(gr, 3, 100, 1e7) == p2p_time(lv, 3, 100, 1e7)


def test_graph_file_plans_as_its_level_file(tmp_path):
    from nest.network.topology import tree_graph
    from nest.planners.registry import run_planner
    from nest.problem.problem import make_problem

    # tiny_cluster.yaml as a graph: 2 devices per node switch (50 GB/s), 2 nodes per rack
    # (5 GB/s per device), 4 racks under a top switch at half the racks' downlink (2:1)
    G = tree_graph([2, 2, 4], [50, 5, 2.5], [0.5, 2.0, 2.5])
    G = nx.relabel_nodes(G, {n: "-".join(map(str, n)) for n in G})
    (tmp_path / "tiny.json").write_text(json.dumps(nx.node_link_data(G, edges="links")))
    d = {**read_yaml(config_dir() / "clusters" / "tiny_cluster.yaml"), "name": "tiny_graph"}
    del d["levels"]
    d["network"] = {"kind": "graph", "file": "tiny.json", "names": ["node", "rack", "top"]}
    path = _write(tmp_path, d)
    assert load_cluster(path, 8).levels == load_cluster("tiny_cluster", 8).levels
    plans = []
    for c in ("tiny_cluster", str(path)):
        out = run_planner("nest", make_problem("tiny_gpt", c, 8), log_crash=False)
        assert out.plan is not None, out.reason
        d = out.plan.to_dict()
        plans.append(({k: v for k, v in d.items() if k not in ("cluster", "solve_time_s")},
                      out.evaluation.time_per_batch_s))
    assert plans[0] == plans[1]


# -- rail-optimised fabric: levels by PXN == the graph's own reduction ---------------------------


@pytest.mark.parametrize("spine_os", [1.0, 2.0])
def test_rail_levels_equal_the_rail_graph_reduction(spine_os):
    # 8 GPUs per node, 4 nodes per rail group, 2 groups; NVLink 450, rail 50 GB/s; hop latencies
    # 1 us into the NVSwitch, 2.5 into the rail switch, 1 into the spine
    G = fabric.rail_graph(8, 4, 2, 450, 50, spine_oversubscription=spine_os)
    r = graph_levels(G, names=["node", "rail_group", "spine"])
    want = fabric.rail_levels(devices_per_node=8, node_GBps=450, node_latency_us=2.0,
                              rail_GBps=50, nodes_per_rail_group=4, rail_latency_us=5.0,
                              num_rail_groups=2, spine_latency_us=7.0,
                              spine_oversubscription=spine_os)
    got = r.levels
    assert [lv["devices_per_group"] for lv in got] == [8, 32, 64]
    for k in ("bandwidth_GBps", "oversubscription", "devices_per_group"):
        assert [lv[k] for lv in got[1:]] == [lv[k] for lv in want[1:]]
    # inside a node the graph also finds the detour over the NIC, rail, spine and back (NCCL
    # keeps intra-node traffic on NVLink; the builder's node level is NVLink's 450 alone)
    assert got[0]["bandwidth_GBps"] == 450 + 50 and want[0]["bandwidth_GBps"] == 450
    # max-flow share per device across the spine: each rail switch's 4 x 50 GB/s downlinks
    # share one uplink of 200 / spine_os
    assert r.effective_GBps[2] == pytest.approx(50 / spine_os)
    # latency: a rail-aligned pair meets at 2 x 2.5 = 5 us; a cross-rail pair (PXN: one NVLink
    # hop, then the rail) at 2 + 5 = 7 us: the graph keeps the worst, the builder the rail's
    assert got[0]["latency_us"] == 2.0 and got[1]["latency_us"] == 7.0
    assert want[1]["latency_us"] == 5.0


def test_rail_superpod_ships_and_says_where_it_approximates():
    c = load_cluster("dgx_h100_rail_superpod")
    assert c.network == "rail_optimized" and c.num_devices == 16384
    assert [lv.devices_per_group for lv in c.levels] == [8, 256, 16384]
    # a data-parallel group of GPU 3 of 32 nodes (one rail) runs at the rail's 50 GB/s x 0.96
    assert path_bandwidth(c, 1) == pytest.approx(48e9)
    assert any("PXN" in n for n in c.notes)


# -- torus with optical-switch cubes -----------------------------------------------------------


def test_tpu_v4_torus_cube_is_a_torus_slice():
    c = load_cluster("tpuv4_torus")
    sizes = [lv.devices_per_group for lv in c.levels]
    assert 64 in sizes and sizes[-1] == 4096
    cube = c.levels[sizes.index(64)]
    # a 4x4x4 slice closed by the OCS: diameter 3 x 2 = 6 hops; bisection 2 x 16 links of
    # 46.875 GB/s over 32 devices = 46.875 GB/s per device (Dally & Towles 2004, 3.3)
    assert cube.latency_s == pytest.approx((1 + 6) * 1e-6)
    assert cube.bytes_per_s == pytest.approx(2 * 16 * 46.875e9 / 32)
    alone = torus_levels((4, 4, 4)).levels[-1]  # the cube as a whole torus of its own
    assert cube.bytes_per_s == pytest.approx(alone["bandwidth_GBps"] * 1e9)
    # without the OCS a 4x4x4 block inside the 16^3 torus is a mesh: diameter 9, half the cut
    mesh = torus_levels((16, 16, 16), block_shapes=[(2, 1, 1), (4, 4, 4)]).levels[1]
    assert mesh["latency_us"] == 1 + 9 and mesh["bandwidth_GBps"] == pytest.approx(46.875 / 2)
    assert any("upper bound" in n for n in c.notes)


def test_nvl72_domain_of_72():
    c = load_cluster("gb200_nvl72", 144)
    assert c.levels[0].devices_per_group == 72 and c.hardware.name == "gb200"
    assert c.levels[0].bytes_per_s == pytest.approx(900e9 * 0.9)
    assert c.level_of(0, 71) == 0 and c.level_of(71, 72) == 1
    with pytest.raises(SpecError, match="multiple of 72"):
        load_cluster("gb200_nvl72", 1024)


# -- the builders through a cluster file --------------------------------------------------------


def test_spine_leaf_builder_gives_the_paper_cluster(tmp_path):
    d = {"name": "sl", "hardware": "h100_sxm", "source": "test", "network": {
        "kind": "spine_leaf", "tiers": [
            {"name": "node", "fanout": 8, "bandwidth_GBps": 450, "latency_us": 2.0,
             "efficiency": 0.82},
            {"name": "leaf", "fanout": 4, "bandwidth_GBps": 12.5, "latency_us": 5.0},
            {"name": "spine", "fanout": 32, "latency_us": 7.0, "oversubscription": 2}]}}
    c = load_cluster(_write(tmp_path, d), 128)
    assert c.levels == load_cluster("h100_spineleaf", 128).levels


def test_multi_plane_and_scale_up_builders(tmp_path):
    d = {"name": "mp", "hardware": "h100_sxm", "source": "test", "network": {
        "kind": "multi_plane", "devices_per_node": 8, "node_GBps": 450, "node_latency_us": 2,
        "planes": 2, "plane_GBps": 25, "tiers": [
            {"name": "pod", "devices_per_group": 512, "latency_us": 5},
            {"name": "top", "devices_per_group": 4096, "latency_us": 8,
             "oversubscription": 4}]}}
    c = load_cluster(_write(tmp_path, d), 1024)
    # two 25 GB/s planes striped: 50 GB/s per device; 4:1 above the pod
    assert [path_bandwidth(c, k) for k in range(3)] == pytest.approx([450e9, 50e9, 12.5e9])
    d = {"name": "su", "hardware": "h100_sxm", "source": "test", "network": {
        "kind": "scale_up", "domain": {"devices": 36, "bandwidth_GBps": 900, "latency_us": 3},
        "scale_out": [{"name": "ib", "devices_per_group": 360, "bandwidth_GBps": 50,
                       "latency_us": 6}]}}
    c = load_cluster(_write(tmp_path, d), 72)
    assert [lv.devices_per_group for lv in c.levels] == [36, 360]


def test_graphml_file_plans_too(tmp_path):
    G = nx.Graph()
    for i in range(4):
        G.add_node(f"g{i}", kind="device")
        G.add_edge(f"g{i}", f"s{i // 2}", bandwidth=100e9, latency=1e-6)
    G.add_node("s0", kind="switch")
    G.add_node("s1", kind="switch")
    G.add_edge("s0", "top", bandwidth=40e9, latency=2e-6)
    G.add_edge("s1", "top", bandwidth=40e9, latency=2e-6)
    G.nodes["top"]["kind"] = "switch"
    (tmp_path / "nets").mkdir()
    nx.write_graphml(G, tmp_path / "nets" / "g.graphml")
    d = {"name": "gml", "hardware": "tiny_accel", "source": "test",
         "network": {"kind": "graph", "file": "nets/g.graphml"}}
    c = load_cluster(_write(tmp_path, d), 4)
    assert [lv.devices_per_group for lv in c.levels] == [2, 4]
    # two devices of a leaf share its 40 GB/s uplink: 20 GB/s each across the top
    assert path_bandwidth(c, 1) == pytest.approx(20e9)
    assert c.levels[1].latency_s == pytest.approx(6e-6)


# -- bad input names the file and key ------------------------------------------------------------


@pytest.mark.parametrize("net, msg", [
    ({"kind": "ring"}, "key 'network.kind': 'ring'; expected one of"),
    ({"kind": "torus", "dims": [4, 4], "link_GBps": 10, "tori": 1}, "key 'network'.*tori"),
    ({"kind": "tiered", "tiers": [{"name": "a", "fanout": 1.5, "latency_us": 1}]},
     "key 'network.tiers.0.fanout'"),
    ({"kind": "torus", "dims": [4, 4], "link_GBps": math.nan}, "key 'network.link_GBps'"),
    ({"kind": "torus", "dims": [4, 4], "link_GBps": 10, "optical_block": [3, 4]},
     "optical_block"),
    ({"kind": "graph", "file": "../outside.json"}, "key 'network.file'.*leaves"),
    ({"kind": "graph", "file": "missing.json"}, "key 'network.file'.*no such regular file"),
    ({"kind": "graph", "file": "/etc/hosts"}, "key 'network.file'.*relative"),
    ({"kind": "torus", "dims": [4096, 4096], "link_GBps": 1}, "key 'network.dims'.*at most"),
    ({"kind": "fat_tree", "tiers": [
        {"name": "a", "fanout": 2, "bandwidth_GBps": 10, "latency_us": 1},
        {"name": "b", "fanout": 2, "latency_us": 1, "oversubscription": 2}]}, "non-blocking"),
])
def test_bad_network_names_file_and_key(tmp_path, net, msg):
    (tmp_path / "outside.json").write_text("{}")
    sub = tmp_path / "clusters"
    sub.mkdir()
    p = _write(sub, {"name": "bad", "hardware": "tiny_accel", "source": "t", "network": net})
    with pytest.raises(SpecError, match=msg) as e:
        load_cluster(p)
    assert str(p) in str(e.value)


def test_builder_error_names_the_file_once(tmp_path):
    """A scale-up group that is not a multiple of the domain (500 over NVL72) said "FILE: key
    'network': FILE: key 'network.scale_out.0.devices_per_group': ..." (the builder's SpecError
    wrapped again as a ValueError)."""
    net = {"kind": "scale_up", "domain": {"devices": 72, "bandwidth_GBps": 900, "latency_us": 3},
           "scale_out": [{"name": "su", "devices_per_group": 500, "bandwidth_GBps": 50,
                          "latency_us": 5}]}
    p = _write(tmp_path, {"name": "bad", "hardware": "tiny_accel", "source": "t", "network": net})
    with pytest.raises(SpecError, match=r"key 'network.scale_out.0.devices_per_group': 500") as e:
        load_cluster(p)
    assert str(e.value).count(str(p)) == 1


def test_bad_graph_files(tmp_path, monkeypatch):
    def load(text, name="g.json"):
        (tmp_path / name).write_text(text)
        p = _write(tmp_path, {"name": "bad", "hardware": "tiny_accel", "source": "t",
                              "network": {"kind": "graph", "file": name}})
        return lambda: load_cluster(p)

    edge = {"source": "a", "target": "b", "bandwidth": -1, "latency": 0}
    data = {"directed": False, "multigraph": False, "graph": {},
            "nodes": [{"id": "a", "kind": "device"}, {"id": "b", "kind": "device"}],
            "links": [edge]}
    with pytest.raises(SpecError, match="edge a-b: attribute bandwidth = -1"):
        load(json.dumps(data))()
    with pytest.raises(SpecError, match="not a readable graph"):
        load("{not json")()
    with pytest.raises(SpecError, match="node 'a': attribute kind = 'gpu'; expected 'device' or "
                                        "'switch'"):
        bad = dict(data, links=[dict(edge, bandwidth=1e9)],
                   nodes=[{"id": "a", "kind": "gpu"}, {"id": "b", "kind": "device"}])
        load(json.dumps(bad))()
    # an edge to a node the file does not list: networkx creates it with no attributes; the
    # message names that node (it said "got ['None']")
    with pytest.raises(SpecError, match="node 'c': attribute kind = None"):
        bad = dict(data, links=[dict(edge, bandwidth=1e9),
                                dict(edge, target="c", bandwidth=1e9)])
        load(json.dumps(bad))()
    monkeypatch.setattr(fabric, "MAX_GRAPH_DEVICES", 1)
    with pytest.raises(SpecError, match="at most 1 devices"):
        load(json.dumps(dict(data, links=[dict(edge, bandwidth=1e9)])))()
    monkeypatch.setattr(fabric, "MAX_GRAPH_BYTES", 10)
    with pytest.raises(SpecError, match="the limit is 10"):
        load(json.dumps(data))()


def test_levels_and_network_together_refused(tmp_path):
    d = read_yaml(config_dir() / "clusters" / "tiny_cluster.yaml")
    d["network"] = {"kind": "torus", "dims": [2, 2], "link_GBps": 1}
    with pytest.raises(SpecError, match="give one of them"):
        cluster_from_dict(d, "x.yaml", None)


# -- cards without measured profiles --------------------------------------------------------------


@pytest.mark.parametrize("name, bf16, fp8, hbm, bw", [
    ("h200_sxm", 989, 1978.9, 141, 4800),   # H200 datasheet (sparse / 2)
    ("b200", 2250, 4500, 180, 7700),        # Blackwell datasheet, HGX B200 (sparse / 2)
    ("gb200", 2500, 5000, 186, 8000),       # Blackwell datasheet, GB200 NVL72 (sparse / 2)
])
def test_new_cards_use_the_roofline_and_say_so(name, bf16, fp8, hbm, bw):
    from nest.interfaces.cli import model_notes
    from nest.problem.problem import make_problem

    hw = load_hardware(name)
    assert hw.profile_dir is None
    assert (hw.peak_flops_per_s, hw.peak_fp8_flops_per_s) == (bf16 * 1e12, fp8 * 1e12)
    assert (hw.hbm_bytes, hw.hbm_bytes_per_s) == (hbm * 1e9, bw * 1e9)
    if name == "gb200":  # the rack totals of the datasheet: 720 PFLOP/s FP8 sparse, 576 TB/s
        assert 72 * 2 * hw.peak_fp8_flops_per_s == 720e15
        assert 72 * hw.hbm_bytes_per_s == 576e12
        pr = make_problem("tiny_gpt", "gb200_nvl72", 72)
        assert pr.costs.profile is None
        assert {r["source"] for r in pr.costs.to_dict()["rows"]} == {"roofline"}
        assert any("roofline" in n for n in model_notes(pr))


def test_a_copied_h100_file_does_not_borrow_its_profiles(tmp_path):
    d = yaml.safe_load((config_dir() / "hardware" / "h100_sxm.yaml").read_text())
    d["name"] = "h200_copy"
    p = tmp_path / "h200_copy.yaml"
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(SpecError, match="measured on 'h100_sxm', not on 'h200_copy'"):
        load_hardware(p)
    assert load_hardware("h100_sxm").profile_dir is not None  # its own profile still loads


def test_cli_plans_evaluates_exports_on_a_torus_cluster_file(tmp_path, capsys):
    """`nest plan`, `evaluate`, `export` on a cluster whose network is a named builder
    (config/clusters/tpuv4_torus.yaml); the output says the roofline prices the card and where
    the torus's level reduction is a bound."""
    from nest.interfaces.cli import main

    p = str(tmp_path / "p.json")
    assert main(["plan", "--model", "tiny_gpt", "--cluster", "tpuv4_torus", "--num-devices",
                 "64", "--planner", "nest", "-o", p]) == 0
    out = capsys.readouterr().out
    assert "priced by the roofline" in out and "note: network: torus 16x16x16" in out
    assert main(["evaluate", p]) == 0 and "note: network: torus" in capsys.readouterr().out
    assert main(["export", p]) == 0 and "64 ranks" in capsys.readouterr().out


SHIPPED = sorted(p.stem for p in (config_dir() / "clusters").glob("*.yaml")
                 if "network" in read_yaml(p))


def test_every_topology_kind_ships_as_a_cluster_file_with_its_source():
    kinds = {read_yaml(config_dir() / "clusters" / f"{n}.yaml")["network"]["kind"]
             for n in SHIPPED}
    assert {"spine_leaf", "scale_up", "rail_optimized", "multi_plane", "torus", "graph"} <= kinds
    for n in SHIPPED:
        assert len(load_cluster(n).source) > 40, n


@pytest.mark.parametrize("name", SHIPPED)
def test_nest_plan_plans_on_every_shipped_network_cluster(name, capsys):
    """`nest plan` (the CLI, exit 0) on each shipped builder / graph cluster, one node-group's
    worth of devices above the first level (72 on NVL72: a plan spans whole domains)."""
    from nest.interfaces.cli import main

    first = load_cluster(name).levels[0].devices_per_group
    n = first if first >= 64 else 64
    rc = main(["plan", "--model", "tiny_gpt", "--cluster", name, "--num-devices", str(n),
               "--planner", "nest"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert " pp=" in out.out


def test_dragonfly_graph_is_not_a_tree_and_says_so():
    """The dragonfly (a graph of our choosing, scripts/make_dragonfly_graph.py): single linkage
    finds node, group and machine; groups without a direct global link route through a third
    group, which the loader's note quantifies; the machine level's share is the global links'
    (36 links x 100 GB/s for 288 GPUs, each pair of groups once) over the NICs."""
    c = load_cluster("dragonfly_h100_graph")
    assert [lv.devices_per_group for lv in c.levels] == [8, 32, 288]
    assert any("chains of cheaper routes" in n for n in c.notes)
    assert c.levels[2].oversubscription > 1


def test_nvlink_sharp_only_on_an_nvlink_switch_domain(tmp_path):
    """NVLS reduces in the NVLink switch: an H100 torus (direct links between neighbours) has none,
    so its first block's all-reduce is the rings' (nvls_bytes_per_s 0); a level file's first level
    and a graph file's keep it unless the file says `nvlink_switch: false`, and then the graph
    prices an all-reduce over one node as the same graph without NVLS (hardware with
    nvls_efficiency 0) does."""
    torus = {"name": "h100_torus", "hardware": "h100_sxm", "sizes": [64],
             "network": {"kind": "torus", "dims": [4, 4, 4], "link_GBps": 25},
             "source": "test: H100 on a torus (not a real machine)"}
    t = cluster_from_dict(torus, "torus.yaml", 64)
    assert t.levels[0].nvls_bytes_per_s == 0.0
    assert load_cluster("h100_spineleaf", 128).levels[0].nvls_bytes_per_s > 0
    import shutil

    d = read_yaml(config_dir() / "clusters" / "h100_spineleaf_graph.yaml")
    net = d["network"]
    shutil.copy(config_dir() / "clusters" / net["file"], tmp_path / "g.json")

    def graph(**kw):
        return load_cluster(_write(tmp_path, {**d, "network": {**net, "file": "g.json", **kw}}),
                            128)

    with_nvls, no_switch = graph(), graph(nvlink_switch=False)
    assert with_nvls.levels[0].nvls_bytes_per_s > 0 and no_switch.levels[0].nvls_bytes_per_s == 0
    from dataclasses import replace

    hw0 = replace(with_nvls.hardware, nvls_efficiency=0.0)
    plain = replace(with_nvls, hardware=hw0,
                    levels=(replace(with_nvls.levels[0], nvls_bytes_per_s=0.0),
                            *with_nvls.levels[1:]))
    node = tuple(range(8))
    assert collective_time(no_switch, "all_reduce", node, 3e8) == collective_time(
        plain, "all_reduce", node, 3e8)
    assert collective_time(with_nvls, "all_reduce", node, 3e8) < collective_time(
        no_switch, "all_reduce", node, 3e8)
    with pytest.raises(SpecError, match="nvlink_switch"):
        graph(nvlink_switch="no")


def test_a_relative_hardware_path_is_read_beside_the_cluster_file(tmp_path, monkeypatch):
    """A cluster file naming its hardware file by a relative path loads from any working folder
    (as its graph file does, and as a plan's model and cluster paths do): the A100 40 GB file
    shipped beside the cluster file was "file not found" once `nest evaluate` ran elsewhere."""
    hw = read_yaml(config_dir() / "hardware" / "a100_sxm.yaml")
    hw.update(name="a100_sxm_40g", hbm_GiB=40)
    (tmp_path / "kit").mkdir()
    _write(tmp_path / "kit", hw, "a100_40g.yaml")
    cl = {"name": "a100_40g_4pn", "hardware": "a100_40g.yaml", "source": "test",
          "levels": [{"name": "node", "devices_per_group": 4, "bandwidth_GBps": 200,
                      "latency_us": 2.0},
                     {"name": "leaf", "devices_per_group": 64, "bandwidth_GBps": 25,
                      "latency_us": 5.0}]}
    path = _write(tmp_path / "kit", cl)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    c = load_cluster(path, 8)
    assert c.hardware.name == "a100_sxm_40g" and c.hardware.hbm_bytes == 40 * 2**30
    # a file of that name in the working folder does not shadow the one beside the cluster
    _write(elsewhere, {**hw, "name": "decoy"}, "a100_40g.yaml")
    assert load_cluster(path, 8).hardware.name == "a100_sxm_40g"
    # a catalog name stays a name
    assert load_cluster(_write(tmp_path / "kit", {**cl, "hardware": "h100_sxm"}, "n.yaml"),
                        8).hardware.name == "h100_sxm"
    # the roofline note names no catalog file the card does not come from
    from nest.interfaces.cli import model_notes
    from nest.problem.problem import make_problem

    notes = " ".join(model_notes(make_problem("tiny_gpt", str(path), 8)))
    assert "roofline" in notes and "config/hardware/a100_sxm_40g.yaml" not in notes


@pytest.mark.parametrize("sizes,bad", [([4, 5], "sizes.1"), ([4, 32], "sizes.1"),
                                       ([0, 4], "sizes.0")])
def test_a_size_the_cluster_cannot_hold_names_the_key(sizes, bad):
    """`sizes` are the device counts a figure's `num_devices: sizes` plans: one the cluster
    refuses as num_devices (5 over 2-device nodes, 32 above its 16) is refused when the file
    loads, naming the key (it was accepted, and failed later inside a Snakemake job)."""
    d = {**read_yaml(config_dir() / "clusters" / "tiny_cluster.yaml"), "sizes": sizes}
    with pytest.raises(SpecError, match=f"key '{bad}'"):
        cluster_from_dict(d, "tiny.yaml", 4)
    for n in (1, 2, 4, 6, 16):  # each one num_devices accepts, as a size too
        cluster_from_dict({**d, "sizes": [n]}, "tiny.yaml", n)


def test_a_level_without_efficiency_is_noted_as_priced_at_line_rate(tmp_path, capsys):
    """A cluster file whose levels state no `efficiency` prices collectives at the line rate
    (NetworkLevel.efficiency 1.0): `nest plan` says so (issue 25: it did so silently), naming the
    levels; a file stating NCCL's shares (dgx_h100_superpod) gets no such note."""
    from nest.interfaces.cli import main

    d = read_yaml(config_dir() / "clusters" / "dgx_h100_superpod.yaml")
    for lv in d["levels"]:
        lv.pop("efficiency")
    d["name"] = "no_eff"
    p = tmp_path / "no_eff.yaml"
    p.write_text(yaml.safe_dump(d))
    args = ["plan", "--model", "tiny_gpt", "--num-devices", "64", "--mbs", "1", "-q"]
    assert main([*args, "--cluster", str(p)]) == 0
    notes = [ln for ln in capsys.readouterr().out.splitlines() if "line rate" in ln]
    assert len(notes) == 1 and all(f"'{lv['name']}'" in notes[0] for lv in d["levels"]), notes
    assert main([*args, "--cluster", "dgx_h100_superpod"]) == 0
    assert "line rate" not in capsys.readouterr().out
