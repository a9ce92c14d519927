# NEST's gain decomposed (capabilities switched off one at a time) and the network co-design sweep.
# Registers its experiments in EXPERIMENTS (common.smk); its config lives under its own keys.


def decomposition_planners():
    d = config["decomposition"]
    return [d.get("reference", "nest"), *d["planners"]]


def decomposition_points():
    """(model, cluster, num_devices, mbs) of every point of the decomposition's figures, once."""
    pts = {}
    for fig in config["decomposition"]["figures"]:
        for _, m, c, n, b in figure_points(fig):
            pts[(m, c, n, b)] = None
    return list(pts)


def decomposition_files(kind):
    return [f"results/{kind}/{p}/{m}/{c}/{n}/mbs{b}.json"
            for m, c, n, b in decomposition_points() for p in decomposition_planners()]


rule decomposition_collect:
    """Evaluations of NEST and every ablation on the decomposition's points -> results CSV (the
    plan rule makes them; the planner wildcard takes any registry name)."""
    input:
        evaluations=lambda wc: decomposition_files("evaluations"),
        plans=lambda wc: decomposition_files("plans"),
    output:
        "results/decomposition.csv",
    log:
        "logs/decomposition/collect.log",
    conda:
        "../envs/nest.yaml"
    script:
        "../scripts/decomposition_collect.py"


rule decomposition_report:
    """Results CSV -> per ablation and cluster T(ablation) / T(NEST) (table, Markdown, figure)."""
    input:
        "results/decomposition.csv",
    output:
        table="results/decomposition_table.csv",
        md="results/decomposition.md",
        png="figures/decomposition.png",
        pdf="figures/decomposition.pdf",
    log:
        "logs/decomposition/report.log",
    conda:
        "../envs/nest.yaml"
    params:
        reference=lambda wc: config["decomposition"].get("reference", "nest"),
        planners=lambda wc: config["decomposition"]["planners"],
    script:
        "../scripts/decomposition_report.py"


EXPERIMENTS["decomposition"] = lambda: [
    *rules.decomposition_collect.output, *rules.decomposition_report.output]


def codesign_inputs(wc):
    cs = config["codesign"]
    c = load_cluster(cs["cluster"])
    return {"graph": f"results/graphs/{cs['model']}/mbs1.json",
            "cluster": catalog("clusters", cs["cluster"]),
            "hardware": catalog("hardware", c.hardware.name),
            "registry": "config/planners.yaml",
            "space": "config/search_space.yaml",
            "training": "config/training.yaml"}


rule codesign:
    """Network co-design sweep: per inter-node bandwidth x oversubscription x size, NEST vs the
    flat-network plan, both scored on that network. Points are cached in results/codesign/
    (keyed by a digest of the inputs), so an interrupted run resumes."""
    input:
        unpack(codesign_inputs),
    output:
        csv="results/codesign.csv",
        md="results/codesign.md",
        png="figures/codesign.png",
        pdf="figures/codesign.pdf",
    log:
        "logs/codesign.log",
    conda:
        "../envs/nest.yaml"
    params:
        cfg=lambda wc: config["codesign"],
        cache="results/codesign",
    script:
        "../scripts/codesign.py"


EXPERIMENTS["codesign"] = lambda: list(rules.codesign.output)
