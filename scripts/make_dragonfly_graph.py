"""Write config/clusters/graphs/dragonfly_h100.json: a dragonfly (Kim, Dally, Scott and Abts 2008,
"Technology-Driven, Highly-Scalable Dragonfly Topology", ISCA, section 3) of H100 nodes, a graph
that is not a tree (routers of a group all-to-all, every pair of groups joined by one global
link), for config/clusters/dragonfly_h100_graph.yaml.

    g = 9 groups of a = 4 routers, h = 2 global links per router (a h = g - 1: one global link
    between every pair of groups, the balanced dragonfly of the paper), one 8-GPU node per
    router: GPUs on the node's NVSwitch (450 GB/s per direction), each GPU's 400 Gb/s NIC
    (50 GB/s) into the router; router-router links inside a group 200 GB/s, global links
    100 GB/s (our choice: a 2:1 taper into the group, 4:1 between groups). One link's latency:
    1 us into the NVSwitch, 1.5 us into a router, 1 us per router-router hop.
Run from the repository root: python scripts/make_dragonfly_graph.py (deterministic bytes).
"""

from __future__ import annotations

import json
from pathlib import Path

G_GROUPS, ROUTERS, H_GLOBAL, PER_NODE = 9, 4, 2, 8
NVS_GBPS, NIC_GBPS, LOCAL_GBPS, GLOBAL_GBPS = 450.0, 50.0, 200.0, 100.0
GB, US = 1e9, 1e-6


def dragonfly() -> dict:
    nodes, links = [], []

    def link(a, b, gbps, us):
        links.append({"bandwidth": gbps * GB, "latency": us * US, "source": a, "target": b})

    for grp in range(G_GROUPS):
        for r in range(ROUTERS):
            node = grp * ROUTERS + r
            router, nvs = f"r{grp}_{r}", f"nvs{node}"
            nodes += [{"id": router, "kind": "switch"}, {"id": nvs, "kind": "switch"}]
            for k in range(PER_NODE):
                gpu = f"gpu{node * PER_NODE + k}"
                nodes.append({"id": gpu, "kind": "device"})
                link(gpu, nvs, NVS_GBPS, 1.0)
                link(gpu, router, NIC_GBPS, 1.5)
        for r in range(ROUTERS):
            for s in range(r + 1, ROUTERS):
                link(f"r{grp}_{r}", f"r{grp}_{s}", LOCAL_GBPS, 1.0)
    # global links: group i's port j (router j // h) goes to group (i + j + 1) mod g; each pair
    # of groups once (the port of the other end is the mirror image)
    for i in range(G_GROUPS):
        for j in range(ROUTERS * H_GLOBAL):
            other = (i + j + 1) % G_GROUPS
            if other > i:
                back = (i - other - 1) % G_GROUPS  # the port of `other` that points at i
                link(f"r{i}_{j // H_GLOBAL}", f"r{other}_{back // H_GLOBAL}", GLOBAL_GBPS, 1.0)
    desc = (f"Dragonfly (Kim et al. 2008): {G_GROUPS} groups x {ROUTERS} routers, {H_GLOBAL} "
            f"global links per router, one {PER_NODE}-GPU H100 node per router; written by "
            f"scripts/make_dragonfly_graph.py. Edge bandwidth in bytes/s, latency in s.")
    return {"directed": False, "multigraph": False, "graph": {"description": desc},
            "nodes": nodes, "links": links}


def main() -> None:
    out = Path("config/clusters/graphs/dragonfly_h100.json")
    d = dragonfly()
    text = ('{"directed": false, "multigraph": false,\n "graph": ' + json.dumps(d["graph"])
            + ',\n "nodes": [\n' + ",\n".join("  " + json.dumps(n) for n in d["nodes"])
            + '],\n "links": [\n'
            + ",\n".join("  " + json.dumps(e, sort_keys=True) for e in d["links"]) + "]}\n")
    out.write_text(text)
    print(f"{out}: {len(d['nodes'])} nodes, {len(d['links'])} links")


if __name__ == "__main__":
    main()
