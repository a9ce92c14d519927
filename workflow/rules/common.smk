# Helpers shared by the rules: expand the config's figure grids into targets.
import itertools
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


def figure_targets():
    unknown = [f for f in config["run"] if f not in config["figures"]]
    if unknown:
        raise ValueError(f"config: key 'run': unknown figure(s) {unknown}; defined: "
                         f"{sorted(config['figures'])}")
    return [f"figures/{fig}.{ext}" for fig in config["run"] for ext in ("png", "pdf")] + [
        f"results/{fig}_summary.md" for fig in config["run"]]


def catalog(kind, name):
    return str(config_dir() / kind / f"{name}.yaml")


def cluster_files(wildcards):
    c = load_cluster(wildcards.cluster)
    return [catalog("clusters", wildcards.cluster), catalog("hardware", c.hardware.name)]
