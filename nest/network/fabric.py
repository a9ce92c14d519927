"""A cluster file's `network:` section (named builder or graph file) -> levels (cluster-YAML dicts).

A cluster YAML gives its network either as `levels:` (nested, contiguous groups) or as
`network:` with a `kind` and that builder's parameters (human units, as in the level files):

  tiered | fat_tree | spine_leaf  tiers: [{name, fanout, bandwidth_GBps, latency_us,
          oversubscription?, efficiency?}]  innermost first; fanout = children per switch
          (devices for tier 0); bandwidth_GBps = per-device uplink towards the tier (default:
          the tier below's); oversubscription = downlink / uplink capacity of the tier's
          switches, dividing the uplink share (Al-Fares et al. 2008, section 2.1).
          nest.network.topology.tree_levels.
  scale_up  domain: {name?, devices, bandwidth_GBps, latency_us, efficiency?} (a scale-up
          domain of any size: an 8-GPU NVSwitch board, a 72-GPU NVL72 rack) and scale_out:
          [{name, devices_per_group, bandwidth_GBps, latency_us, oversubscription?,
          efficiency?}] above it (each a multiple of the one below).
  rail_optimized  devices_per_node, node_GBps, node_latency_us, node_efficiency?; rail_GBps
          (one NIC per GPU), nodes_per_rail_group (nodes whose GPU k share rail switch k: a
          scalable unit), rail_latency_us, rail_efficiency?, rail_efficiency_low? (the low end
          of a stated per-NIC band: priced at rail_efficiency, noted; ClusterSpec.at_band_low_end);
          num_rail_groups, spine_latency_us, spine_oversubscription?. See `rail_levels` for the
          reduction and where it is exact.
  multi_plane  devices_per_node, node_GBps, node_latency_us, node_efficiency?; planes,
          plane_GBps (each device's NIC bandwidth on one plane), plane_efficiency?, tiers:
          [{name, devices_per_group, latency_us, oversubscription?}] of one plane (every plane
          the same): a device stripes its traffic over its planes (NCCL uses every NIC), so a
          tier gives planes x plane_GBps / oversubscription per device.
  torus   dims, link_GBps, wrap?, hop_latency_us?, base_latency_us?, block_shapes?,
          optical_block?, optical_latency_us?, names?, efficiency? (one per level).
          nest.network.topology.torus_levels (Appendix B.2's hop-distance classes).
  graph   file (GraphML or node-link JSON, relative to the cluster file, inside its folder),
          names?, efficiency? (one per level), message_bytes?: nest.network.topology.
          graph_levels on a networkx graph whose nodes have kind "device" | "switch" and whose
          edges have bandwidth (bytes/s) and latency (s).

Every kind reduces to levels, which every planner, the evaluator and the exact solver price;
the solver is exact for that priced model. Where the reduction is an approximation of the
topology (a torus's non-cubic sub-blocks, graph pairs joined through chains of cheaper routes)
`network_levels` returns a note saying so, and the cluster carries it (ClusterSpec.notes).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import networkx as nx

from nest.common.errors import SpecError
from nest.network.topology import _bw_os, _level, graph_levels, torus_levels, tree_levels

GB, US = 1e9, 1e-6
MAX_GRAPH_BYTES = 32 * 2**20  # a graph file larger than this is refused (a 16K-device fabric
# in node-link JSON is ~5 MB)
# graph_levels keeps route costs from every device to every node (devices x nodes floats, a few
# such arrays): a graph with more is refused before any route is computed
MAX_GRAPH_DEVICES, MAX_GRAPH_NODES = 4096, 16384
MAX_TORUS_DEVICES = 65536  # torus_levels lists every coordinate (nest.spec.catalog.MAX_DEVICES)
KINDS = ("tiered", "fat_tree", "spine_leaf", "scale_up", "rail_optimized", "multi_plane",
         "torus", "graph")


def network_levels(net: dict, where: str, base_dir: Path | None
                   ) -> tuple[list[dict], list[str], tuple[str, ...]]:
    """(levels, notes, device names) of a validated `network:` mapping; `where` names the file
    in errors, `base_dir` is the folder graph files are resolved in (None: graph files refused).
    The names are what the description calls each device id where the reduction to levels
    numbers devices otherwise than it lists them (a graph file's node ids, a torus's 'x,y,z'
    coordinates; ClusterSpec.device_names); () for the builders that number them host by
    host."""
    kind = net["kind"]
    key = f"{where}: key 'network"
    band = _band_notes(net, key)
    try:
        if kind in ("tiered", "fat_tree", "spine_leaf"):
            return _tiered(net["tiers"], kind), [], ()
        if kind == "scale_up":
            return _scale_up(net, key), [], ()
        if kind == "rail_optimized":
            args = {k: v for k, v in net.items() if k not in ("kind", "rail_efficiency_low")}
            return rail_levels(**args), [RAIL_NOTE, *band], ()
        if kind == "multi_plane":
            return _multi_plane(net, key), [], ()
        if kind == "torus":
            return _torus(net, key)
        return _graph(net, where, base_dir)
    except SpecError:  # already names the file and key (a ValueError too: not wrapped again)
        raise
    except ValueError as e:  # a builder's own check (nesting, divisibility)
        raise SpecError(f"{key}': {e}") from None


def _band_notes(net: dict, key: str) -> list[str]:
    """The note of a rail_optimized network's stated per-NIC band (`rail_efficiency_low`, the
    band's low end; the rails are priced at `rail_efficiency`, its nominal)."""
    low = net.get("rail_efficiency_low")
    if low is None:
        return []
    nominal = net.get("rail_efficiency", 1.0)
    if low > nominal:
        raise SpecError(f"{key}.rail_efficiency_low': {low} exceeds rail_efficiency {nominal}; "
                        f"expected the low end of the per-NIC band (at most the nominal)")
    rail = net["rail_GBps"]
    return [f"scale-out band: the rails are priced at {nominal:g} x {rail:g} GB/s per NIC "
            f"({nominal * rail:.1f} GB/s); the cluster file states {low:g} ({low * rail:.1f} "
            f"GB/s) as the band's low end, where every time on the rails is up to "
            f"{nominal / low - 1:.1%} longer (ClusterSpec.at_band_low_end)"]


def _effs(levels: list[dict], effs, key: str) -> list[dict]:
    if effs is None:
        return levels
    if len(effs) != len(levels):
        raise SpecError(f"{key}.efficiency': {len(effs)} values for {len(levels)} levels "
                        f"({', '.join(lv['name'] for lv in levels)})")
    for lv, e in zip(levels, effs):
        if e != 1:
            lv["efficiency"] = float(e)
    return levels


def _tiered(tiers: list[dict], kind: str) -> list[dict]:
    """Tiers -> tree_levels: a tier's uplink share is its bandwidth (default: the tier
    below's) over its oversubscription."""
    ups, prev = [], None
    for i, t in enumerate(tiers):
        bw = t.get("bandwidth_GBps", prev)
        if bw is None:
            raise ValueError(f"tiers.{i}.bandwidth_GBps: the innermost tier needs one")
        if kind == "fat_tree" and t.get("oversubscription", 1) != 1:
            raise ValueError(f"tiers.{i}.oversubscription: a fat tree is non-blocking (1); "
                             f"use kind spine_leaf or tiered for an oversubscribed tier")
        ups.append(bw / t.get("oversubscription", 1))
        prev = bw
    levels = tree_levels([t["fanout"] for t in tiers], ups, [t["latency_us"] for t in tiers],
                         [t["name"] for t in tiers])
    for lv, t in zip(levels, tiers):
        if t.get("efficiency", 1) != 1:
            lv["efficiency"] = float(t["efficiency"])
    return levels


def _stacked(first: dict, above: list[dict], key: str) -> list[dict]:
    """A first level plus levels above given with devices_per_group (uplink shares as
    `_bw_os` writes them)."""
    levels = [first]
    for i, t in enumerate(above):
        lo = levels[-1]["devices_per_group"]
        if t["devices_per_group"] <= lo or t["devices_per_group"] % lo:
            raise SpecError(f"{key}.{i}.devices_per_group': {t['devices_per_group']} must be "
                            f"a larger multiple of the level below ({lo})")
        up = t["bandwidth_GBps"] / t.get("oversubscription", 1)
        bw, os = _bw_os(len(levels), up, [lv["bandwidth_GBps"] for lv in levels])
        lv = _level(t["name"], t["devices_per_group"], bw, t["latency_us"], os)
        if t.get("efficiency", 1) != 1:
            lv["efficiency"] = float(t["efficiency"])
        levels.append(lv)
    return levels


def _scale_up(net: dict, key: str) -> list[dict]:
    d = net["domain"]
    first = _level(d.get("name", "domain"), d["devices"], d["bandwidth_GBps"], d["latency_us"])
    if d.get("efficiency", 1) != 1:
        first["efficiency"] = float(d["efficiency"])
    return _stacked(first, net.get("scale_out", []), f"{key}.scale_out")


def _multi_plane(net: dict, key: str) -> list[dict]:
    first = _level("node", net["devices_per_node"], net["node_GBps"], net["node_latency_us"])
    if net.get("node_efficiency", 1) != 1:
        first["efficiency"] = float(net["node_efficiency"])
    per_device = net["planes"] * net["plane_GBps"]
    above = [{**t, "bandwidth_GBps": per_device,
              **({"efficiency": net["plane_efficiency"]} if "plane_efficiency" in net else {})}
             for t in net["tiers"]]
    return _stacked(first, above, f"{key}.tiers")


RAIL_NOTE = ("rail-optimised fabric reduced to levels node / rail group / spine: exact in "
             "bandwidth with NCCL's PXN (a cross-rail transfer first moves over NVLink to the "
             "GPU on the destination's rail, so every transfer inside a rail group stays on one "
             "rail switch); every pair of a rail group is priced at the rail latency, which "
             "rail-aligned pairs have and cross-rail pairs exceed by one NVLink hop")


def rail_levels(*, devices_per_node: int, node_GBps: float, node_latency_us: float,
                rail_GBps: float, nodes_per_rail_group: int, rail_latency_us: float,
                num_rail_groups: int = 1, spine_latency_us: float | None = None,
                spine_oversubscription: float = 1.0, node_efficiency: float = 1.0,
                rail_efficiency: float = 1.0, names=("node", "rail_group", "spine")
                ) -> list[dict]:
    """Levels of a rail-optimised fat tree (NVIDIA DGX SuperPOD reference architecture: GPU k
    of every node of a scalable unit on rail switch k; the rail switches under spines).
    Rail groups cross node groups, which nested levels cannot hold; with PXN (NCCL 2.12,
    "PXN: PCI x NVLink") a transfer between GPU j of node A and GPU k of node B goes
    A.j -> A.k over NVLink, then rail k, so inside a rail group every inter-node byte crosses
    exactly one rail switch at rail_GBps per GPU and the rail group is one level: per device
    rail_GBps, non-blocking. Above, rail switches share spine uplinks:
    rail_GBps / spine_oversubscription per device. `rail_graph` builds the same fabric as a
    graph; graph_levels of it gives these levels (tests/test_cluster_topologies.py)."""
    n, g = int(devices_per_node), int(devices_per_node) * int(nodes_per_rail_group)
    levels = [_level(names[0], n, node_GBps, node_latency_us),
              _level(names[1], g, rail_GBps, rail_latency_us)]
    if num_rail_groups > 1:
        lat = spine_latency_us if spine_latency_us is not None else rail_latency_us
        bw, os = _bw_os(2, rail_GBps / spine_oversubscription,
                        [lv["bandwidth_GBps"] for lv in levels])
        levels.append(_level(names[2], g * int(num_rail_groups), bw, lat, os))
    for lv, e in zip(levels, (node_efficiency, rail_efficiency, rail_efficiency)):
        if e != 1:
            lv["efficiency"] = float(e)
    return levels


def rail_graph(devices_per_node: int, nodes_per_rail_group: int, num_rail_groups: int,
               node_GBps: float, rail_GBps: float, *, hop_latency_us=(1.0, 2.5, 1.0),
               spine_oversubscription: float = 1.0, num_spines: int = 1) -> nx.Graph:
    """The rail-optimised fabric as a graph: devices ("dev", i) numbered node-major, one
    NVSwitch ("nvs", node) per node, rail switch ("rail", group, k) for GPU k of the group's
    nodes, spines ("spine", s) over all rail switches. hop_latency_us: one link into the
    NVSwitch, the rail switch, the spine."""
    G = nx.Graph()
    per_group = devices_per_node * nodes_per_rail_group
    n_dev = per_group * num_rail_groups
    up = nodes_per_rail_group * rail_GBps / spine_oversubscription / num_spines
    for i in range(n_dev):
        node, k = divmod(i, devices_per_node)
        grp = i // per_group
        dev, nvs, rail = ("dev", i), ("nvs", node), ("rail", grp, k)
        G.add_node(dev, kind="device")
        G.add_node(nvs, kind="switch")
        G.add_node(rail, kind="switch")
        G.add_edge(dev, nvs, bandwidth=node_GBps * GB, latency=hop_latency_us[0] * US)
        G.add_edge(dev, rail, bandwidth=rail_GBps * GB, latency=hop_latency_us[1] * US)
        if num_rail_groups > 1:
            for s in range(num_spines):
                G.add_node(("spine", s), kind="switch")
                G.add_edge(rail, ("spine", s), bandwidth=up * GB,
                           latency=hop_latency_us[2] * US)
    return G


def _torus(net: dict, key: str) -> tuple[list[dict], list[str], tuple[str, ...]]:
    if math.prod(net["dims"]) > MAX_TORUS_DEVICES:
        raise SpecError(f"{key}.dims': {net['dims']} holds {math.prod(net['dims'])} devices; "
                        f"at most {MAX_TORUS_DEVICES}")
    kw = {k: net[k] for k in ("link_GBps", "wrap", "hop_latency_us", "base_latency_us",
                              "optical_block", "optical_latency_us", "names") if k in net}
    if "block_shapes" in net:
        kw["block_shapes"] = [tuple(b) for b in net["block_shapes"]]
    t = torus_levels(tuple(net["dims"]), **kw)
    notes = [f"torus {'x'.join(map(str, net['dims']))} reduced to {len(t.levels)} nested "
             f"blocks ({', '.join('x'.join(map(str, s)) for s in t.block_shapes)}; Appendix "
             f"B.2): an all-reduce / all-gather / reduce-scatter over one whole block runs "
             f"rings on all of the block's links; any other group, and every all-to-all, is "
             f"priced at the smallest block holding it (its hop diameter and bisection share), "
             f"an upper bound on its time"]
    levels = _effs(t.levels, net.get("efficiency"), key)
    levels[0]["nvlink_switch"] = False  # direct links between neighbours: no switch to reduce in
    # each device id's chip, 'x,y,z' (the reduction numbers them block-major)
    return levels, notes, tuple(",".join(map(str, c)) for c in t.device_order)


def resolve_graph_file(name: str, where: str, base_dir: Path | None) -> Path:
    """The graph file a cluster file names: relative to the cluster file's folder and inside
    it, a regular file of at most MAX_GRAPH_BYTES."""
    key = f"{where}: key 'network.file'"
    if base_dir is None:
        raise SpecError(f"{key}: {name!r}: a graph file needs a cluster file to be relative to")
    if Path(name).is_absolute():
        raise SpecError(f"{key}: {name!r}: give a path relative to the cluster file's folder")
    root = base_dir.resolve()
    path = (root / name).resolve()
    if root not in path.parents:
        raise SpecError(f"{key}: {name!r} leaves the cluster file's folder {root}")
    if not path.is_file():
        raise SpecError(f"{key}: {name!r}: no such regular file ({path})")
    size = path.stat().st_size
    if size > MAX_GRAPH_BYTES:
        raise SpecError(f"{key}: {name!r} is {size} bytes; the limit is {MAX_GRAPH_BYTES}")
    if path.suffix not in (".graphml", ".json"):
        raise SpecError(f"{key}: {name!r}: expected a .graphml or node-link .json file")
    return path


def read_graph(path: Path, key: str) -> nx.Graph:
    """A GraphML or node-link JSON file -> networkx graph (edge bandwidth / latency floats)."""
    try:
        if path.suffix == ".graphml":
            G = nx.read_graphml(path)
        else:
            data = json.loads(path.read_text(encoding="utf-8"))
            links = "links" if "links" in data else "edges"
            G = nx.node_link_graph(data, edges=links)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError) as e:
        raise SpecError(f"{key}: {path.name}: not a readable graph: {e}") from None
    except Exception as e:  # noqa: BLE001 - XML parse errors come in several classes
        raise SpecError(f"{key}: {path.name}: not a readable graph: "
                        f"{type(e).__name__}: {e}") from None
    for u, v, d in G.edges(data=True):
        for attr, low in (("bandwidth", 0.0), ("latency", -1.0)):
            x = d.get(attr, 0.0 if attr == "latency" else None)
            try:
                x = float(x)
            except (TypeError, ValueError):
                x = math.nan
            if not math.isfinite(x) or x <= low or (attr == "latency" and x < 0):
                raise SpecError(f"{key}: {path.name}: edge {u}-{v}: attribute {attr} = "
                                f"{d.get(attr)!r}; expected a finite number "
                                f"{'> 0 (bytes/s)' if attr == 'bandwidth' else '>= 0 (s)'}")
            d[attr] = x
    n_dev = sum(1 for _, d in G.nodes(data=True) if d.get("kind") == "device")
    if n_dev > MAX_GRAPH_DEVICES or G.number_of_nodes() > MAX_GRAPH_NODES:
        raise SpecError(f"{key}: {path.name}: {n_dev} devices, {G.number_of_nodes()} nodes; "
                        f"a graph file may hold at most {MAX_GRAPH_DEVICES} devices and "
                        f"{MAX_GRAPH_NODES} nodes (route costs are kept per device and node): "
                        f"describe a larger fabric with a named builder")
    odd = sorted((str(n) for n, d in G.nodes(data=True) if d.get("kind") not in
                  ("device", "switch")), key=lambda n: (len(n), n))
    if odd:  # an edge to a node the file does not list creates one without attributes
        n = odd[0]
        raise SpecError(f"{key}: {path.name}: node {n!r}: attribute kind = "
                        f"{G.nodes[_node_id(G, n)].get('kind')!r}; expected 'device' or "
                        f"'switch' (a node an edge names must be listed with its kind)"
                        + (f" ({len(odd) - 1} more such node(s))" if len(odd) > 1 else ""))
    return G


def _node_id(G, name: str):
    """The node of G whose str() is `name` (GraphML ids are strings, node-link ids any JSON)."""
    return next(n for n in G.nodes if str(n) == name)


def _graph(net: dict, where: str, base_dir: Path | None
           ) -> tuple[list[dict], list[str], tuple[str, ...]]:
    path = resolve_graph_file(net["file"], where, base_dir)
    key = f"{where}: key 'network.file'"
    st = path.stat()
    names = tuple(net["names"]) if "names" in net else None
    memo = (str(path), st.st_mtime_ns, st.st_size, names, net.get("message_bytes", 1e6))
    if memo not in _GRAPH_LEVELS:  # graph_levels of a 1024-device fabric takes seconds
        G = read_graph(path, key)
        try:
            r = graph_levels(G, names=list(names) if names else None, message_bytes=memo[-1])
        except (ValueError, IndexError) as e:
            raise SpecError(f"{key}: {path.name}: {e}") from None
        _GRAPH_LEVELS[memo] = (json.dumps(r.levels), [f"graph {path.name}: {w}"
                                                      for w in r.warnings],
                               tuple(str(x) for x in r.device_order))
    levels, notes, names = _GRAPH_LEVELS[memo]
    levels = _effs(json.loads(levels), net.get("efficiency"), f"{where}: key 'network")
    if "nvlink_switch" in net:  # a graph does not say whether its first level is a switch
        levels[0]["nvlink_switch"] = bool(net["nvlink_switch"])
    return levels, notes, names


# (path, mtime, size, names, message bytes) -> (levels JSON, notes, node id of each device id)
_GRAPH_LEVELS: dict = {}


def validate_network(net, where: str) -> None:
    """Check a `network:` mapping against nest/schemas/network.json, branch chosen by `kind`
    (so an error names the key, not 'valid under none of the schemas'); numbers finite."""
    import jsonschema

    from nest.common.inputs import _error_path, load_schema

    key = f"{where}: key 'network"
    if not isinstance(net, dict):
        raise SpecError(f"{key}': expected a mapping with a kind, got {type(net).__name__}")
    if net.get("kind") not in KINDS:
        raise SpecError(f"{key}.kind': {net.get('kind')!r}; expected one of {', '.join(KINDS)}")
    schema = load_schema("network")
    branch = next(b for b in schema["oneOf"]
                  if net["kind"] in b["properties"]["kind"].get("enum", [
                      b["properties"]["kind"].get("const")]))
    v = jsonschema.Draft202012Validator({**branch, "$defs": schema["$defs"]})
    errors = sorted(v.iter_errors(net), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        path = _error_path(e)
        raise SpecError(f"{key}{'.' + path if path != '<top level>' else ''}': {e.message}")
    _finite(net, "network", where)


def _finite(x, path: str, where: str) -> None:
    if isinstance(x, float) and not math.isfinite(x):
        raise SpecError(f"{where}: key '{path}': {x}; expected a finite number")
    if isinstance(x, dict):
        for k, v in x.items():
            _finite(v, f"{path}.{k}", where)
    elif isinstance(x, list):
        for i, v in enumerate(x):
            _finite(v, f"{path}.{i}", where)


def expand_network(d: dict, where: str
                   ) -> tuple[dict, tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """A cluster mapping with `network:` -> the same mapping with `levels:`, the notes on where
    the level reduction approximates the topology, the files it read (a graph file) and the
    device names of `network_levels`."""
    if "levels" in d:
        raise SpecError(f"{where}: keys 'levels' and 'network': give one of them, not both")
    net = d["network"]
    validate_network(net, where)
    p = Path(where)
    base = p.parent if p.is_file() else None
    levels, notes, names = network_levels(net, where, base)
    out = {k: v for k, v in d.items() if k != "network"}
    out["levels"] = levels
    files = (str(resolve_graph_file(net["file"], where, base)),) if net["kind"] == "graph" else ()
    return out, tuple(notes), files, names
