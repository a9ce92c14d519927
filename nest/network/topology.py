"""Network description (tiers, torus, networkx graph) -> cluster levels (cluster-YAML dicts).

The level-wise abstraction (NEST section 4.2, Appendix B): devices sit in nested groups of equal
size, contiguous in device id; two devices communicate over the level of their lowest common
group. Per level (innermost first), as config/clusters/*.yaml and nest.spec.catalog.NetworkLevel hold it:
devices_per_group, bandwidth_GBps (per device, per direction), latency_us (end to end),
oversubscription. nest.network.collectives prices a flow meeting at level L at
    bw(L) = min_{k<=L} bandwidth_k / oversubscription_L,
so a builder that knows the per-device uplink share up(L) of level L (what each device of a
level-(L-1) group gets when the whole group sends across level L at once) writes
    level 0 and 1:  bandwidth_L = up(L), oversubscription_L = 1
    level L >= 2:   bandwidth_L = up(L), oversubscription 1      if up(L) >= lower
                    bandwidth_L = lower, oversubscription_L = lower / up(L)  otherwise,
with lower = min_{1<=k<L} bandwidth_k: a switch tier whose uplinks carry less than the tier
below delivers is oversubscribed (Al-Fares et al. 2008, "A Scalable, Commodity Data Center
Network Architecture", section 2.1: oversubscription = downlink / uplink capacity). The step
from a level-0 group (a scale-up domain: NVLink, HGX) to the network above is a slower network,
not an oversubscribed switch, so level 1 is never written as oversubscribed; either way the
collectives price the same bandwidth. This convention reproduces the catalog's YAML files.

Builders:
  tiered (`tree_levels`, `fat_tree_levels`, `spine_leaf_levels`): the paper's descriptions
      (section 5.2, 5.3, Appendix B.1); a non-blocking fat tree has oversubscription 1.
  torus (`torus_levels`; Appendix B.2: hop-distance / coordinate-affinity classes): nested
      sub-blocks of the torus, each a level; latency = base + hop diameter x per-hop latency;
      bandwidth = min(links into the block per device x link, bisection share), the bisection
      share being bisection links x link / (n / 2) (uniform-traffic bound; Dally & Towles 2004,
      "Principles and Practices of Interconnection Networks", section 3.3); no switches, so
      oversubscription 1 and the bandwidth is the share itself. A ring collective over a whole
      block runs bidirectional rings along every dimension at once (each device drives all its
      links in the block), which the bisection share does not limit: the level's
      ring_bandwidth_GBps = links per device x link, which nest.network.collectives prices for
      all-reduce / all-gather / reduce-scatter groups that are one whole block.
  graph (`graph_levels`): any networkx graph of devices and switches (node attribute
      kind="device"|"switch"; edge attributes bandwidth in bytes/s and latency in s). Routes
      are least-cost paths (cost = latency + message_bytes / bandwidth per link); devices are
      grouped by single linkage on route cost (pairs whose routes climb to the same switch tier
      cost the same, so the groups are the switches' subtrees); per level, latency = the
      largest route latency of a pair meeting there, up(L) = max-flow from one level-(L-1)
      group to the rest of its level-L group (links inside the group uncapped) per device,
      scaled down if a bisection of the level-L group (half its subgroups to the other half,
      max-flow) carries less per device.
`nested_grouping` checks an explicit device-pair level matrix and returns the permutation that
makes its groups contiguous; `cluster_dict` / `write_cluster_yaml` produce a cluster YAML.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import networkx as nx
import numpy as np
import yaml

from nest.common.errors import SpecError
from nest.spec.catalog import validate

GB, US = 1e9, 1e-6


def _level(name: str, n: int, bw_GBps: float, lat_us: float, os: float = 1.0) -> dict:
    return {"name": name, "devices_per_group": int(n), "bandwidth_GBps": _r(bw_GBps),
            "latency_us": _r(lat_us), "oversubscription": _r(os)}


def _r(x: float) -> float:
    return float(f"{x:.6g}")


def _bw_os(k: int, up: float, below: list[float]) -> tuple[float, float]:
    """(bandwidth, oversubscription) of level k with per-device uplink share `up` above levels
    of bandwidths `below` (see the module docstring)."""
    lower = min(below[1:k], default=math.inf)
    if k < 2 or up >= lower * (1 - 1e-9):
        return up, 1.0
    return lower, lower / up


# --------------------------------------------------------------------------------------------
# Tiered descriptions
# --------------------------------------------------------------------------------------------


def tree_levels(fanouts, up_GBps, latency_us, names=None) -> list[dict]:
    """Levels of a tree of switch tiers. fanouts[i]: children per tier-i switch (devices for
    i = 0); up_GBps[i]: uplink capacity per device below a tier-i switch towards it (tier 0:
    the device's own link); latency_us[i]: end-to-end latency of a pair meeting at tier i."""
    names = names or [f"level{i}" for i in range(len(fanouts))]
    if not len(fanouts) == len(up_GBps) == len(latency_us) == len(names):
        raise ValueError("tree_levels: fanouts, up_GBps, latency_us and names need one entry "
                         "per tier")
    levels, n = [], 1
    for i, (name, k, up, lat) in enumerate(zip(names, fanouts, up_GBps, latency_us)):
        n *= int(k)
        bw, os = _bw_os(i, up, [lv["bandwidth_GBps"] for lv in levels])
        levels.append(_level(name, n, bw, lat, os))
    return levels


def fat_tree_levels(devices_per_node: int = 8, node_GBps: float = 450, nodes_per_leaf: int = 4,
                    leaf_GBps: float = 100, num_leaves: int = 32, agg_GBps: float = 400,
                    latency_us=(2.0, 5.0, 7.0), names=("node", "leaf", "agg")) -> list[dict]:
    """The paper's TPUv4-like fat tree (section 5.2, Figure 8(a)): 8 devices per node on a
    "900 GB/s" (bidirectional: 450 per direction) link, 4 nodes per level-1 switch at 100 GB/s
    per device, level-2 aggregation at 400 GB/s per device; non-blocking. Defaults give config/clusters/tpuv4_fattree.yaml."""
    return tree_levels([devices_per_node, nodes_per_leaf, num_leaves],
                       [node_GBps, leaf_GBps, agg_GBps], latency_us, list(names))


def spine_leaf_levels(devices_per_node: int = 8, node_GBps: float = 450,
                      nodes_per_leaf: int = 4, leaf_port_GBps: float = 12.5,
                      num_leaves: int = 32, num_spines: int = 2, uplink_GBps: float = 100,
                      latency_us=(2.0, 5.0, 7.0), names=("node", "leaf", "spine"),
                      node_efficiency: float | None = 0.82) -> list[dict]:
    """The paper's H100 spine-leaf (section 5.3): leaves join nodes_per_leaf nodes at
    leaf_port_GBps per device and connect to each of num_spines spines by one uplink_GBps
    link. Oversubscription = leaf downlink / uplink capacity = devices_per_leaf x port /
    (num_spines x uplink); defaults (32 x 12.5 / 200 = 2) give config/clusters/h100_spineleaf.
    node_efficiency: NCCL's share of the NVLink line rate (0.82, see that file)."""
    per_leaf = devices_per_node * nodes_per_leaf
    levels = tree_levels([devices_per_node, nodes_per_leaf, num_leaves],
                         [node_GBps, leaf_port_GBps, num_spines * uplink_GBps / per_leaf],
                         latency_us, list(names))
    if node_efficiency is not None:
        levels[0]["efficiency"] = node_efficiency
    return levels


def tree_graph(fanouts, up_GBps, hop_latency_us, num_top: int = 1) -> nx.Graph:
    """A networkx graph of `tree_levels`' tree: devices ("dev", i), switches ("sw", tier, j).
    A tier-i switch links each child with capacity (devices under the child) x up_GBps[i]; the
    top tier has num_top parallel switches sharing that capacity (spine-leaf). hop_latency_us[i]
    is one link's latency into tier i (a pair meeting at tier i crosses 2 (i + 1) links)."""
    G = nx.Graph()
    n_dev = int(np.prod(fanouts))
    children = [("dev", d) for d in range(n_dev)]
    G.add_nodes_from(children, kind="device")
    below = 1
    for tier, (k, up, lat) in enumerate(zip(fanouts, up_GBps, hop_latency_us)):
        count = num_top if tier == len(fanouts) - 1 else 1
        parents_of = []
        for j in range(len(children) // int(k)):
            parents = [("sw", tier, j * count + s) for s in range(count)]
            G.add_nodes_from(parents, kind="switch")
            for par in parents:
                for c in children[j * k:(j + 1) * k]:
                    G.add_edge(c, par, bandwidth=below * up * GB / count, latency=lat * US)
            parents_of.append(parents[0])
        children = parents_of
        below *= int(k)
    return G


# --------------------------------------------------------------------------------------------
# Torus
# --------------------------------------------------------------------------------------------


@dataclass
class TorusLevels:
    levels: list[dict]
    block_shapes: list[tuple[int, ...]]
    hop_diameters: list[int]
    device_order: list[tuple[int, ...]]  # cluster device id -> torus coordinate


def _grow(c: int, d: int) -> int:
    """The next extent of a block's side c (dividing d) towards d: c times the smallest prime
    factor of d / c, so every block divides the next (2c while d / c is even: a power-of-two
    torus doubles; 4 -> 12 on a side of 12, 1 -> 3 on a side of 3)."""
    r = d // c
    return c * next((f for f in range(2, r + 1) if r % f == 0), 1)


def _default_blocks(dims: tuple[int, ...]) -> list[tuple[int, ...]]:
    """1-hop pairs, 2-hop tiles, ... (Appendix B.2): grow one dimension at a time to 2 (its
    smallest prime factor when odd), then grow every dimension at once (doubling where it
    divides, `_grow`) up to the full torus."""
    shapes, cur = [], [1] * len(dims)
    for i, d in enumerate(dims):
        if d >= 2:
            cur[i] = _grow(1, d)
            shapes.append(tuple(cur))
    while tuple(cur) != tuple(dims):
        cur = [_grow(c, d) for c, d in zip(cur, dims)]
        shapes.append(tuple(cur))
    return shapes


def torus_levels(dims=(4, 4, 4), link_GBps: float = 46.875, *, block_shapes=None,
                 wrap: bool = True, hop_latency_us: float = 1.0, base_latency_us: float = 1.0,
                 names=None, optical_block=None, optical_latency_us: float = 0.0
                 ) -> TorusLevels:
    """Levels of a k-D torus (or mesh, wrap=False) by hop-distance classes: nested blocks.
    Default link: TPU v4, 24 TB/s bisection per 16x16x16 pod (Cloud TPU v4 documentation) over
    2 x 16 x 16 = 512 cut links = 46.9 GB/s per link and direction (Jouppi et al. 2023 give
    six ICI links per chip). Devices are numbered block-major so every block is contiguous.
    optical_block: the shape of the electrically wired unit whose faces meet optical circuit
    switches (TPU v4: 4x4x4 cubes; Jouppi et al. 2023, section 2): the unit is one of the
    levels, and a block made of whole units is a slice the switches close into a torus (wrap
    in every dimension longer than 2, whatever the full torus); levels above one unit cost
    optical_latency_us more (the switch adds a fibre path, no packet hop)."""
    dims = tuple(int(d) for d in dims)
    shapes = [tuple(s) for s in (block_shapes or _default_blocks(dims))]
    unit = tuple(int(c) for c in optical_block) if optical_block is not None else None
    if unit is not None:
        if len(unit) != len(dims) or any(d % c for c, d in zip(unit, dims)):
            raise ValueError(f"torus_levels: optical_block {unit} must divide dims {dims}")
        if block_shapes is None:  # grow to the unit, then double towards the full torus
            shapes = _default_blocks(unit)
            cur = list(unit)
            while tuple(cur) != dims:
                cur = [_grow(c, d) for c, d in zip(cur, dims)]
                shapes.append(tuple(cur))
        elif unit not in shapes:
            raise ValueError(f"torus_levels: block_shapes must include optical_block {unit}")
    if shapes[-1] != dims:
        shapes.append(dims)
    for lo, hi in zip(shapes, shapes[1:]):
        if any(h % l_ for l_, h in zip(lo, hi)) or lo == hi:
            raise ValueError(f"torus_levels: block {lo} must strictly nest in {hi}")
    levels, diams = [], []
    for i, s in enumerate(shapes):
        n = int(np.prod(s))
        sliced = unit is not None and all(k % c == 0 for k, c in zip(s, unit))
        ring = [(sliced or (wrap and k == d)) and k > 2 for k, d in zip(s, dims)]
        diam = sum(k // 2 if r else k - 1 for k, r in zip(s, ring))
        links = sum((2 if r else 1) if k > 1 else 0 for k, r in zip(s, ring))  # per device
        # links cut by halving the block across one dimension (an odd side is cut as evenly as
        # it goes: a ring still loses 2 links, a line 1), per device of a half (n / 2)
        cuts = [n // k * (2 if r else 1) for k, r in zip(s, ring) if k > 1]
        bis = min(cuts) * link_GBps / (n / 2) if cuts else links * link_GBps
        eff = min(links * link_GBps, bis)  # no switches: the share itself, oversubscription 1
        name = names[i] if names else f"hop{diam}"
        ocs = optical_latency_us if unit is not None and n > int(np.prod(unit)) else 0.0
        lv = _level(name, n, eff, base_latency_us + diam * hop_latency_us + ocs)
        if links * link_GBps > eff * (1 + 1e-9):  # rings over every link of the block
            lv["ring_bandwidth_GBps"] = _r(links * link_GBps)
        levels.append(lv)
        diams.append(diam)
    coords = sorted(itertools.product(*[range(d) for d in dims]),
                    key=lambda c: [tuple(x // k for x, k in zip(c, s)) for s in shapes[::-1]])
    return TorusLevels(levels, shapes, diams, coords)


def torus_graph(dims, link_GBps: float = 46.875, hop_latency_us: float = 1.0,
                wrap: bool = True) -> nx.Graph:
    """The torus as a networkx graph of devices (nodes are coordinates) for `graph_levels`-style
    analysis; a dimension of 2 has one link, not two."""
    G = nx.grid_graph(dim=list(dims)[::-1], periodic=wrap)
    G = nx.relabel_nodes(G, {n: tuple(n) for n in G})
    for n in G:
        G.nodes[n]["kind"] = "device"
    nx.set_edge_attributes(G, link_GBps * GB, "bandwidth")
    nx.set_edge_attributes(G, hop_latency_us * US, "latency")
    return G


# --------------------------------------------------------------------------------------------
# Explicit level matrices
# --------------------------------------------------------------------------------------------


@dataclass
class Grouping:
    devices_per_group: list[int]
    groups: list[list[list[int]]]  # per level, the groups of (original) device ids
    order: list[int]  # new device id -> original device id; groups are contiguous in it
    contiguous: bool  # the original numbering already has contiguous groups


def level_matrix(levels, num_devices: int) -> np.ndarray:
    """level_NN[a, b]: index of the lowest level whose group holds devices a and b (-1 when
    a == b), from level dicts or a nest.spec.catalog.ClusterSpec."""
    sizes = [lv["devices_per_group"] if isinstance(lv, dict) else lv.devices_per_group
             for lv in getattr(levels, "levels", levels)]
    ids = np.arange(num_devices)
    out = np.full((num_devices, num_devices), len(sizes), dtype=int)
    for k in reversed(range(len(sizes))):
        same = (ids[:, None] // sizes[k]) == (ids[None, :] // sizes[k])
        out[same] = k
    if (out == len(sizes)).any():
        raise ValueError(f"level_matrix: {num_devices} devices exceed the top level's "
                         f"{sizes[-1]}")
    np.fill_diagonal(out, -1)
    return out


def nested_grouping(level_NN) -> Grouping:
    """Check that a device-pair level matrix describes nested groups of equal size per level
    (an ultrametric: L[a, c] <= max(L[a, b], L[b, c])), and find the device order that makes
    every group contiguous (stable: groups keep the order of their smallest id)."""
    L = np.asarray(level_NN)
    n = L.shape[0]
    if L.shape != (n, n) or not np.array_equal(L, L.T):
        raise ValueError(f"level matrix: must be square and symmetric, got shape {L.shape}")
    if np.any(np.diag(L) != -1) or (n > 1 and L[~np.eye(n, dtype=bool)].min() < 0):
        raise ValueError("level matrix: diagonal must be -1 and other entries >= 0")
    top = int(L.max()) if n > 1 else 0
    groups, sizes, labels = [], [], []
    for k in range(top + 1):
        lab = np.full(n, -1)
        gs = []
        for a in range(n):
            if lab[a] >= 0:
                continue
            members = np.flatnonzero(L[a] <= k)
            if np.any(lab[members] >= 0) or np.any(L[np.ix_(members, members)] > k):
                raise ValueError(f"level matrix: level {k} does not split the devices into "
                                 f"groups (device {a}'s peers at level <= {k} are not all "
                                 f"peers of each other): not a nested grouping")
            lab[members] = len(gs)
            gs.append(members.tolist())
        size = {len(g) for g in gs}
        if len(size) != 1:
            raise ValueError(f"level matrix: level {k} has groups of sizes {sorted(size)}; the "
                             f"level-wise abstraction needs equal sizes")
        size = size.pop()
        if sizes and size == sizes[-1]:
            raise ValueError(f"level matrix: level {k} joins no new pairs")
        groups.append(gs)
        sizes.append(size)
        labels.append(lab)
    if sizes and sizes[-1] != n:
        raise ValueError(f"level matrix: the top level {top} does not join all {n} devices")
    first = [np.array([min(g) for g in gs])[lab] for gs, lab in zip(groups, labels)]
    order = sorted(range(n), key=lambda a: [f[a] for f in first[::-1]] + [a])
    contiguous = order == list(range(n))
    return Grouping(sizes, groups, order, contiguous)


# --------------------------------------------------------------------------------------------
# Arbitrary graphs
# --------------------------------------------------------------------------------------------


@dataclass
class GraphLevels:
    levels: list[dict]
    device_order: list  # cluster device id -> graph node
    level_matrix: np.ndarray  # in cluster device ids
    effective_GBps: list[float]  # per-device bandwidth of a flow meeting at each level
    warnings: list[str] = field(default_factory=list)


def graph_levels(G: nx.Graph, *, devices=None, names=None, message_bytes: float = 1e6,
                 rel_tol: float = 1e-6, max_sources: int = 64) -> GraphLevels:
    """Levels of an arbitrary network graph (see the module docstring)."""
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import dijkstra
    from scipy.spatial.distance import squareform

    if G.is_multigraph():  # parallel links add their bandwidth
        H = nx.Graph()
        H.add_nodes_from(G.nodes(data=True))
        for u, v, d in G.edges(data=True):
            if H.has_edge(u, v):
                H[u][v]["bandwidth"] += d["bandwidth"]
                H[u][v]["latency"] = min(H[u][v]["latency"], d["latency"])
            else:
                H.add_edge(u, v, bandwidth=d["bandwidth"], latency=d["latency"])
        G = H
    devs = list(devices) if devices is not None else \
        [n for n, d in G.nodes(data=True) if d.get("kind") == "device"]
    if len(devs) < 2:
        raise ValueError("graph_levels: need at least 2 devices (node attribute "
                         "kind='device', or pass devices=)")
    nodes = list(G.nodes)
    idx = {v: i for i, v in enumerate(nodes)}
    V, N = len(nodes), len(devs)
    rows, cols, cost, lat = [], [], [], []
    for u, v, d in G.edges(data=True):
        bw, la = d.get("bandwidth"), d.get("latency", 0.0)
        if not bw or bw <= 0 or la < 0:
            raise ValueError(f"graph_levels: edge {u}-{v}: needs bandwidth > 0 (bytes/s) and "
                             f"latency >= 0 (s), got {bw}, {la}")
        for a, b in ((u, v), (v, u)):
            rows.append(idx[a])
            cols.append(idx[b])
            cost.append(la + message_bytes / bw)
            lat.append(la)
    Wc = csr_matrix((cost, (rows, cols)), shape=(V, V))
    Wl = csr_matrix((lat, (rows, cols)), shape=(V, V))
    dev_i = np.array([idx[d] for d in devs])
    D, pred = dijkstra(Wc, directed=True, indices=dev_i, return_predecessors=True)
    if not np.isfinite(D[:, dev_i]).all():  # name what the best-connected device cannot reach
        reach = np.isfinite(D[:, dev_i])
        ref = int(np.argmax(reach.sum(axis=1)))
        lost = [d for d, ok in zip(devs, reach[ref]) if not ok]
        names = ", ".join(repr(d) for d in lost[:5]) + (", ..." if len(lost) > 5 else "")
        raise ValueError(f"graph_levels: device {names} has no route to device {devs[ref]!r}"
                         if len(lost) == 1 else
                         f"graph_levels: {len(lost)} devices have no route to device "
                         f"{devs[ref]!r}: {names} (every device must be linked to the others)")
    route_lat = _route_latency(pred, Wl)[:, dev_i]
    C = D[:, dev_i]
    C = np.minimum(C, C.T)
    np.fill_diagonal(C, 0.0)

    # single linkage on route cost -> nested groups; distinct merge heights are the levels
    Z = linkage(squareform(C, checks=False), method="single")
    heights = []
    for h in np.sort(Z[:, 2]):
        if not heights or h > heights[-1] * (1 + rel_tol):
            heights.append(h)
    L = np.full((N, N), -1)
    labels = []
    for k, h in enumerate(heights):
        lab = fcluster(Z, t=h * (1 + rel_tol), criterion="distance")
        labels.append(lab)
        same = (lab[:, None] == lab[None, :]) & (L < 0)
        L[same] = k
    np.fill_diagonal(L, -1)
    warnings = []
    for k, h in enumerate(heights):
        worst = C[L == k].max()
        if worst > h * (1 + 1e-3):
            warnings.append(f"level {k}: pairs joined through chains of cheaper routes cost up "
                            f"to {worst / h:.2f}x the level's route cost (not a tree-like "
                            f"hierarchy; consider torus_levels or explicit groups)")
    grp = nested_grouping(L)
    order = np.array(grp.order)
    L = L[np.ix_(order, order)]
    route_lat = route_lat[np.ix_(order, order)]
    dev_order = [devs[i] for i in order]

    dev_set = set(devs)
    switches = {n for n in G if n not in dev_set}
    levels, effs = [], []
    names = names or [f"level{k}" for k in range(len(heights))]
    for k, n_k in enumerate(grp.devices_per_group):
        grp_k = list(range(n_k))  # the level-k group holding device 0 (contiguous now)
        sub = grp.devices_per_group[k - 1] if k else 1
        inner = list(range(sub))
        src = [dev_order[i] for i in inner]
        dst = [dev_order[i] for i in grp_k[sub:]]
        allowed = {dev_order[i] for i in grp_k} | switches
        cap_edges = _inner_edges(G, D, devs, order, inner, idx, Wc, max_sources) if k else set()
        up = max_flow(G, src, dst, allowed, uncapped=cap_edges) / len(src)
        eff = max_flow(G, src, dst, allowed) / len(src)
        half = (n_k // sub // 2) * sub
        if n_k // sub >= 2:
            a = [dev_order[i] for i in grp_k[:half]]
            b = [dev_order[i] for i in grp_k[half:]]
            bis = max_flow(G, a, b, allowed) / len(a)
            if bis < eff * (1 - 1e-9):
                up, eff = up * bis / eff, bis
        up_GBps, eff_GBps = up / GB, eff / GB
        bw, os = _bw_os(k, up_GBps, [lv["bandwidth_GBps"] for lv in levels])
        lat_us = route_lat[L == k].max() / US
        levels.append(_level(names[k], n_k, bw, lat_us, os))
        effs.append(_r(eff_GBps))
        priced = min(lv["bandwidth_GBps"] for lv in levels) / os
        if abs(priced - eff_GBps) > 0.01 * eff_GBps:
            warnings.append(f"level {k}: priced at {priced:.4g} GB/s per device but the "
                            f"max-flow share is {eff_GBps:.4g} GB/s")
    return GraphLevels(levels, dev_order, L, effs, warnings)


def _route_latency(pred: np.ndarray, Wl) -> np.ndarray:
    """Latency along each least-cost route: pointer jumping on the predecessor trees."""
    S, V = pred.shape
    rows = np.repeat(np.arange(S)[:, None], V, axis=1)
    cols = np.tile(np.arange(V), (S, 1))
    ok = pred >= 0
    acc = np.zeros((S, V))
    acc[ok] = np.asarray(Wl[pred[ok], cols[ok]]).ravel()
    ptr = np.where(ok, pred, -1)
    for _ in range(max(1, int(np.ceil(np.log2(V))) + 1)):
        ok = ptr >= 0
        if not ok.any():
            break
        nxt_acc = np.zeros((S, V))
        nxt_ptr = np.full((S, V), -1)
        nxt_acc[ok] = acc[rows[ok], ptr[ok]]
        nxt_ptr[ok] = ptr[rows[ok], ptr[ok]]
        acc = acc + nxt_acc
        ptr = nxt_ptr
    return acc


def _inner_edges(G, D, devs, order, inner, idx, Wc, max_sources) -> set:
    """Edges on least-cost routes between devices of one group (sampled sources)."""
    rows = [order[i] for i in inner]  # rows of D (devices in the original order)
    nodes = list(G.nodes)
    tgt = np.array([idx[devs[r]] for r in rows])
    srcs = rows if len(rows) <= max_sources else \
        [rows[i] for i in np.linspace(0, len(rows) - 1, max_sources).astype(int)]
    Wc = Wc.tocoo()
    out = set()
    for r in srcs:
        d = D[r]
        # v lies on a least-cost route from r to some group member t
        dt = D[rows][:, :]  # distances from members (rows) to every node
        on = np.any(np.isclose(d[None, :] + dt, d[tgt][:, None], rtol=1e-9, atol=0), axis=0)
        on_edge = on[Wc.row] & on[Wc.col] & np.isclose(d[Wc.row] + Wc.data, d[Wc.col],
                                                       rtol=1e-9, atol=0)
        for u, v in zip(Wc.row[on_edge], Wc.col[on_edge]):
            out.add(frozenset((nodes[u], nodes[v])))
    return out


def max_flow(G: nx.Graph, src, dst, allowed=None, uncapped=frozenset()) -> float:
    """Max-flow (bytes/s) from the nodes `src` to the nodes `dst` over links of capacity
    `bandwidth` in each direction, through `allowed` nodes only (default all); links in
    `uncapped` (frozensets of their ends) are unbounded."""
    Fg = nx.DiGraph()
    for u, v, d in G.edges(data=True):
        if allowed is not None and (u not in allowed or v not in allowed):
            continue
        attrs = {} if frozenset((u, v)) in uncapped else {"capacity": d["bandwidth"]}
        Fg.add_edge(u, v, **attrs)  # no capacity attribute: unbounded
        Fg.add_edge(v, u, **attrs)
    s, t = ("__source__",), ("__sink__",)
    for a in src:
        Fg.add_edge(s, a)  # no capacity attribute: unbounded
    for b in dst:
        Fg.add_edge(b, t)
    try:
        value, _ = nx.maximum_flow(Fg, s, t)
    except nx.NetworkXUnbounded:
        raise ValueError("graph_levels: a group reaches its peers only over links inside the "
                         "group; give the links between groups their bandwidth") from None
    return float(value)


# --------------------------------------------------------------------------------------------
# Cluster YAML
# --------------------------------------------------------------------------------------------


def cluster_dict(name: str, hardware: str, levels: list[dict], *, sizes=None,
                 source: str) -> dict:
    """A cluster YAML mapping (config/clusters/*.yaml), validated against the schema."""
    d = {"name": name, "hardware": hardware, "levels": [dict(lv) for lv in levels]}
    if sizes:
        d["sizes"] = [int(s) for s in sizes]
    d["source"] = source
    validate(d, "cluster", f"cluster '{name}'")
    for i in range(1, len(levels)):
        lo, hi = levels[i - 1]["devices_per_group"], levels[i]["devices_per_group"]
        if hi <= lo or hi % lo:
            raise SpecError(f"cluster '{name}': key 'levels.{i}.devices_per_group': {hi} must "
                            f"be a larger multiple of the level below ({lo})")
    return d


def write_cluster_yaml(path: str | Path, cluster: dict, comment: str = "") -> None:
    """Write a cluster mapping in the catalog's layout (one flow-style line per level)."""
    lines = [f"# {c}" for c in comment.splitlines()] if comment else []
    dump = lambda x: yaml.safe_dump(x, default_flow_style=True, width=1000,
                                    sort_keys=False).strip()
    lines += [f"name: {cluster['name']}", f"hardware: {cluster['hardware']}", "levels:"]
    lines += [f"  - {dump(lv)}" for lv in cluster["levels"]]
    if "sizes" in cluster:
        lines.append(f"sizes: {dump(cluster['sizes'])}")
    lines.append(f"source: {json.dumps(cluster['source'])}")
    from nest.common.atomic_io import write_text_atomic

    write_text_atomic(path, "\n".join(lines) + "\n")
