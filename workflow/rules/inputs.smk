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


# ---- robustness.smk ----


def robustness_cfg():
    """The config's `robustness` entry with the decomposition's ablations and reference."""
    r = dict(config["robustness"])
    d = config.get("decomposition") or {}
    if r.get("decomposition") and d:
        r["decomposition_planners"] = list(r["decomposition"])
        r["reference"] = d.get("reference", "nest")
    return r


def robustness_scales():
    from nest.common.errors import SpecError
    from nest.experiments.robustness import perturbations, scale_name

    try:
        return [scale_name(c, m) for c, m in perturbations(config["robustness"])]
    except SpecError:  # a bad entry: check_config() names its file and key once the rules load
        return []


def robustness_points():
    """(model, cluster, num_devices, batch) -> (figure planners, ablations) of every point of
    the robustness figures (and of the decomposition's, when it is included)."""
    r = robustness_cfg()
    pts = {}
    for fig in r.get("figures", []):
        for pt in figure_points(fig):
            pts.setdefault((pt.model, pt.cluster, pt.num_devices, pt.batch), ({}, {}))[0][
                pt.planner] = None
    if r.get("decomposition_planners"):
        for fig in config["decomposition"]["figures"]:
            for pt in figure_points(fig):
                key = (pt.model, pt.cluster, pt.num_devices, pt.batch)
                ablations = pts.setdefault(key, ({}, {}))[1]
                for p in (r["reference"], *r["decomposition_planners"]):
                    ablations[p] = None
    return pts


def robustness_jobs():
    """(model, cluster, batch) -> [(num_devices, [re-planned], [rescored])]: one job per model
    and cluster; the rescored planners keep their unperturbed plan."""
    rb = config["robustness"]
    rescore = set(rb.get("rescore", []))
    out = {}
    for (m, c, n, b), (figs, abl) in robustness_points().items():
        replan = [p for p in dict.fromkeys([*figs, *abl]) if p not in rescore]
        out.setdefault((m, c, b), []).append((n, replan, [p for p in figs if p in rescore]))
    return out


def robustness_rescored_plans(wc):
    """The unperturbed plan files of a job's rescored planners, in its points' order."""
    return [f"results/plans/{p}/{wc.model}/{wc.cluster}/{n}/{wc.batch}.json"
            for n, _, rescored in robustness_jobs()[(wc.model, wc.cluster, wc.batch)]
            for p in rescored]


def robustness_inputs(wc):
    r = robustness_cfg()
    out = {"points": [f"results/robustness/{s}/{m}/{c}/{b}.json"
                      for s in robustness_scales() for m, c, b in robustness_jobs()],
           "figures": [f"results/{fig}.csv" for fig in r.get("figures", [])]}
    if r.get("decomposition_planners"):
        out["decomposition"] = "results/decomposition.csv"
    if r.get("codesign_num_devices"):
        out["codesign"] = [f"results/robustness/codesign/{s}.csv" for s in robustness_scales()]
        out["codesign_base"] = "results/codesign.csv"
    return out
