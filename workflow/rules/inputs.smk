# Input functions of the experiment rules (decomposition.smk, tables.smk): kept apart from
# the rules (Snakemake's lint), included after common.smk.

# ---- decomposition.smk ----


def decomposition_planners():
    d = config["decomposition"]
    return [d.get("reference", "nest"), *d["planners"]]


def decomposition_points():
    """(model, cluster, num_devices, batch) of every point of the decomposition's figures, once."""
    pts = {}
    for fig in config["decomposition"]["figures"]:
        for pt in figure_points(fig):
            pts[(pt.model, pt.cluster, pt.num_devices, pt.batch)] = None
    return list(pts)


def decomposition_files(kind):
    """The reference planner's files (the figures' plan rule makes them) or, for kind "points",
    one file per point holding every ablation (decomposition_point)."""
    if kind == "points":
        return [f"results/decomposition/{m}/{c}/{n}/{b}.json"
                for m, c, n, b in decomposition_points()]
    ref = config["decomposition"].get("reference", "nest")
    return [f"results/{kind}/{ref}/{m}/{c}/{n}/{b}.json"
            for m, c, n, b in decomposition_points()]


def codesign_inputs(wc):
    cs = config["codesign"]
    c = load_cluster(cs["cluster"])
    return {"graph": f"results/graphs/{cs['model']}/mbs1.json",
            "cluster": catalog("clusters", cs["cluster"]),
            "network": network_files(c),
            "hardware": catalog("hardware", c.hardware.name),
            "registry": "config/planners.yaml",
            "space": "config/search_space.yaml",
            "training": "config/training.yaml"}


# ---- tables.smk ----


def tables_cfg(name):
    return config["tables"][name]


def _cluster_files(cluster):
    c = load_cluster(cluster)
    return [catalog("clusters", cluster), catalog("hardware", c.hardware.name),
            *network_files(c)]


def _point_files(kind, points):
    return [point_file(kind, pt) for pt in points]


def table2_points():
    t = tables_cfg("table2")
    return [pt for pt in figure_points(t["figure"]) if pt.cluster == t["cluster"]
            and pt.num_devices == t["num_devices"] and pt.mbs == t.get("mbs", 1)]


def table6_models(wc=None):
    import json as _json

    hw = tables_cfg("table6")["hardware"]
    blocks = _json.loads(Path(f"profiles/{hw}/blocks.json").read_text())["blocks"]
    return [b["model"] for b in blocks if "error" not in b]


def table7_point_files():
    t = tables_cfg("table7")
    return [f"results/table7/{m}/{v}.json" for m, pt in t["points"].items()
            for v in pt["variants"]]


def figure2_points():
    f = tables_cfg("figure2")
    return [Point(p, m, f["cluster"], f["num_devices"], 1, "mbs1")
            for m in f["models"] for p in f["planners"]]


def comm_share_points():
    t = tables_cfg("comm_share")
    out = []
    for fig in t["figures"]:
        out += [pt for pt in figure_points(fig) if pt.planner == t["planner"]
                and pt.model == t["model"]]
    return list(dict.fromkeys(out))
