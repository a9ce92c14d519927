# Helpers shared by the rules: expand the config's figure grids into targets.
import itertools
import os
from pathlib import Path

from nest.planners import planner_names
from nest.specs import config_dir, load_cluster


def figure_planners(fig):
    p = config["figures"][fig].get("planners", "all")
    return planner_names(figures_only=True) if p == "all" else list(p)


def figure_points(fig):
    """(planner, model, cluster, num_devices, mbs) of every point of a figure."""
    f = config["figures"][fig]
    for model, cluster, mbs in itertools.product(f["models"], f["clusters"], f.get("mbs", [1])):
        sizes = f["num_devices"]
        if sizes == "sizes":
            sizes = list(load_cluster(cluster).sizes)
        for n, planner in itertools.product(sizes, figure_planners(fig)):
            yield planner, model, cluster, n, mbs


def figure_evaluations(wildcards):
    return [f"results/evaluations/{p}/{m}/{c}/{n}/mbs{b}.json"
            for p, m, c, n, b in figure_points(wildcards.figure)]


def figure_plans(wildcards):
    return [f"results/plans/{p}/{m}/{c}/{n}/mbs{b}.json"
            for p, m, c, n, b in figure_points(wildcards.figure)]


wildcard_constraints:
    figure="|".join(sorted(config["figures"], key=len, reverse=True)),
    num_devices=r"\d+",
    mbs=r"\d+",
    planner="|".join(sorted(planner_names(), key=len, reverse=True)),


# Experiments other than figure grids register here: name -> function returning their targets.
# A name in config["run"] is either a figure of config["figures"] or one of these.
EXPERIMENTS = {}


def figure_outputs(fig):
    return [f"figures/{fig}.{ext}" for ext in ("png", "pdf")] + [
        f"results/{fig}_summary.md", f"results/{fig}_table.csv"]


def figure_targets():
    """Every target of the experiments named in config["run"]."""
    known = sorted(config["figures"]) + sorted(EXPERIMENTS)
    unknown = [f for f in config["run"] if f not in known]
    if unknown:
        raise ValueError(f"config: key 'run': unknown experiment(s) {unknown}; defined: {known}")
    out = []
    for name in config["run"]:
        out += figure_outputs(name) if name in config["figures"] else EXPERIMENTS[name]()
    return out


def catalog(kind, name):
    return str(config_dir() / kind / f"{name}.yaml")


def cluster_files(wildcards):
    c = load_cluster(wildcards.cluster)
    return [catalog("clusters", wildcards.cluster), catalog("hardware", c.hardware.name)]
