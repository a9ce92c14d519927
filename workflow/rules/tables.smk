# The paper's tables (2, 6, 7), Figure 2 and section 5.3's communication share.
# Registers its experiments in EXPERIMENTS (common.smk); its config lives under its own keys.
# Library code: nest/tables.py; scripts: workflow/scripts/table_*.py. Planner runs are one file
# per point (Figure 2 through the plan rule, Table 7 through table7_point), so an
# interrupted run resumes where it stopped.


def tables_cfg(name):
    return config["tables"][name]


def _cluster_files(cluster):
    return [catalog("clusters", cluster), catalog("hardware", load_cluster(cluster).hardware.name)]


def _point_files(kind, points):
    return [f"results/{kind}/{p}/{m}/{c}/{n}/mbs{b}.json" for p, m, c, n, b in points]


# ---- Table 2: strategies at 512 devices, from the plans of figure5's planners ----------------


def table2_points():
    t = tables_cfg("table2")
    return [pt for pt in figure_points(t["figure"])
            if pt[2] == t["cluster"] and pt[3] == t["num_devices"] and pt[4] == t["mbs"]]


rule table2:
    """Each planner's strategy at 512 devices beside the paper's Table 2."""
    input:
        plans=lambda wc: _point_files("plans", table2_points()),
        evaluations=lambda wc: _point_files("evaluations", table2_points()),
        claims="config/paper/claims.yaml",
    output:
        csv="results/table2.csv",
        md="results/table2.md",
    log:
        "logs/tables/table2.log",
    conda:
        "../envs/nest.yaml"
    script:
        "../scripts/table_strategies.py"


EXPERIMENTS["table2"] = lambda: rules.table2.output


# ---- Table 6: predicted vs measured peak memory -----------------------------------------------


def table6_models(wc=None):
    import json as _json

    hw = tables_cfg("table6")["hardware"]
    blocks = _json.loads(Path(f"profiles/{hw}/blocks.json").read_text())["blocks"]
    return [b["model"] for b in blocks if "error" not in b]


rule table6:
    """Per-device peak memory of one block: predicted, measured (profiles/), the paper's."""
    input:
        blocks=lambda wc: f"profiles/{tables_cfg('table6')['hardware']}/blocks.json",
        hardware=lambda wc: catalog("hardware", tables_cfg("table6")["hardware"]),
        graphs=lambda wc: [f"results/graphs/{m}/mbs1.json" for m in table6_models()],
        training="config/training.yaml",
        claims="config/paper/claims.yaml",
    output:
        csv="results/table6.csv",
        md="results/table6.md",
    log:
        "logs/tables/table6.log",
    conda:
        "../envs/nest.yaml"
    params:
        cfg=lambda wc: tables_cfg("table6"),
    script:
        "../scripts/table_memory.py"


EXPERIMENTS["table6"] = lambda: rules.table6.output


# ---- Table 7: ZeRO ablation at reduced HBM, one JSON per point --------------------------------


def table7_point_files():
    t = tables_cfg("table7")
    return [f"results/table7/{m}/{v}.json" for m, pt in t["points"].items()
            for v in pt["variants"]]


rule table7_point:
    """One (model, variant) point of the ZeRO ablation: NEST on the reduced-HBM problem."""
    input:
        graph="results/graphs/{model}/mbs1.json",
        cluster=lambda wc: _cluster_files(tables_cfg("table7")["cluster"]),
        registry="config/planners.yaml",
        space="config/search_space.yaml",
        training="config/training.yaml",
    output:
        "results/table7/{model}/{variant}.json",
    log:
        "logs/tables/table7/{model}/{variant}.log",
    conda:
        "../envs/nest.yaml"
    params:
        cfg=lambda wc: tables_cfg("table7"),
    script:
        "../scripts/table_ablation_point.py"


rule table7:
    """The ZeRO ablation's points beside the paper's Table 7."""
    input:
        points=lambda wc: table7_point_files(),
        claims="config/paper/claims.yaml",
    output:
        csv="results/table7.csv",
        md="results/table7.md",
    log:
        "logs/tables/table7.log",
    conda:
        "../envs/nest.yaml"
    script:
        "../scripts/table_ablation.py"


EXPERIMENTS["table7"] = lambda: rules.table7.output


# ---- Figure 2: communication share at 64 devices (plans through the plan rule) ----------------


def figure2_points():
    f = tables_cfg("figure2")
    return [(p, m, f["cluster"], f["num_devices"], 1) for m in f["models"] for p in f["planners"]]


rule figure2:
    """Time per batch split into compute / communication / bubble for each planner's plan."""
    input:
        plans=lambda wc: _point_files("plans", figure2_points()),
        evaluations=lambda wc: _point_files("evaluations", figure2_points()),
        claims="config/paper/claims.yaml",
    output:
        csv="results/figure2.csv",
        md="results/figure2.md",
        png="figures/figure2.png",
        pdf="figures/figure2.pdf",
    log:
        "logs/tables/figure2.log",
    conda:
        "../envs/nest.yaml"
    params:
        cfg=lambda wc: tables_cfg("figure2"),
    script:
        "../scripts/table_comm.py"


EXPERIMENTS["figure2"] = lambda: rules.figure2.output


# ---- Section 5.3: Mixtral's communication share in NEST's figure plans ------------------------


def comm_share_points():
    t = tables_cfg("comm_share")
    out = []
    for fig in t["figures"]:
        out += [pt for pt in figure_points(fig) if pt[0] == t["planner"] and pt[1] == t["model"]]
    return list(dict.fromkeys(out))


rule comm_share:
    """Communication share of NEST's Mixtral plans on the fat tree and the spine-leaf."""
    input:
        plans=lambda wc: _point_files("plans", comm_share_points()),
        evaluations=lambda wc: _point_files("evaluations", comm_share_points()),
        claims="config/paper/claims.yaml",
    output:
        csv="results/comm_share.csv",
        md="results/comm_share.md",
    log:
        "logs/tables/comm_share.log",
    conda:
        "../envs/nest.yaml"
    params:
        cfg=lambda wc: tables_cfg("comm_share"),
    script:
        "../scripts/table_comm.py"


EXPERIMENTS["comm_share"] = lambda: rules.comm_share.output
