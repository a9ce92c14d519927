# The paper's tables (2, 6, 7), Figure 2 and section 5.3's communication share.
# Registers its experiments in EXPERIMENTS (common.smk); its config lives under its own keys.
# Library code: nest/experiments/tables.py; scripts: workflow/scripts/table_*.py. Planner runs are one file
# per point (Figure 2 through the plan rule, Table 7 through table7_point), so an
# interrupted run resumes where it stopped.


# ---- Table 2: strategies at 512 devices, from the plans of figure5's planners ----------------


rule table2:
    """Each planner's strategy at 512 devices beside the paper's Table 2."""
    input:
        plans=lambda wc: _point_files("plans", table2_points()),
        evaluations=lambda wc: _point_files("evaluations", table2_points()),
        claims="config/paper/claims.yaml",
    output:
        csv=report("results/table2.csv", category="Tables", subcategory="table2"),
        md="results/table2.md",
    log:
        "logs/tables/table2.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=15,
    conda:
        "../envs/nest.yaml"
    params:
        code=CODE,
    script:
        "../scripts/table_strategies.py"


EXPERIMENTS["table2"] = lambda: rules.table2.output


# ---- Table 6: predicted vs measured peak memory -----------------------------------------------


rule table6:
    """Per-device peak memory of one block: predicted, measured (profiles/), the paper's."""
    input:
        blocks=lambda wc: f"profiles/{tables_cfg('table6')['hardware']}/blocks.json",
        hardware=lambda wc: catalog("hardware", tables_cfg("table6")["hardware"]),
        graphs=lambda wc: [f"results/graphs/{m}/mbs1.json" for m in table6_models()],
        training="config/training.yaml",
        claims="config/paper/claims.yaml",
    output:
        csv=report("results/table6.csv", category="Tables", subcategory="table6"),
        md="results/table6.md",
    log:
        "logs/tables/table6.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        "../envs/nest.yaml"
    params:
        cfg=lambda wc: tables_cfg("table6"),
        code=CODE,
    script:
        "../scripts/table_memory.py"


EXPERIMENTS["table6"] = lambda: rules.table6.output


# ---- Table 7: ZeRO ablation at reduced HBM, one JSON per point --------------------------------


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
    threads: 1
    resources:
        mem_mb=6000,
        runtime=120,
    conda:
        "../envs/nest.yaml"
    params:
        cfg=lambda wc: tables_cfg("table7"),
        code=CODE,
    script:
        "../scripts/table_ablation_point.py"


rule table7:
    """The ZeRO ablation's points beside the paper's Table 7."""
    input:
        points=lambda wc: table7_point_files(),
        claims="config/paper/claims.yaml",
    output:
        csv=report("results/table7.csv", category="Tables", subcategory="table7"),
        md="results/table7.md",
    log:
        "logs/tables/table7.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=15,
    conda:
        "../envs/nest.yaml"
    params:
        code=CODE,
    script:
        "../scripts/table_ablation.py"


EXPERIMENTS["table7"] = lambda: rules.table7.output


# ---- Figure 2: communication share at 64 devices (plans through the plan rule) ----------------


rule figure2:
    """Time per batch split into compute / communication / bubble for each planner's plan."""
    input:
        plans=lambda wc: _point_files("plans", figure2_points()),
        evaluations=lambda wc: _point_files("evaluations", figure2_points()),
        claims="config/paper/claims.yaml",
    output:
        csv=report("results/figure2.csv", category="Tables", subcategory="figure2"),
        md="results/figure2.md",
        png=report("figures/figure2.png", category="Tables", subcategory="figure2"),
        pdf="figures/figure2.pdf",
    log:
        "logs/tables/figure2.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=15,
    conda:
        "../envs/nest.yaml"
    params:
        cfg=lambda wc: tables_cfg("figure2"),
        code=CODE,
    script:
        "../scripts/table_comm.py"


EXPERIMENTS["figure2"] = lambda: rules.figure2.output


# ---- Section 5.3: Mixtral's communication share in NEST's figure plans ------------------------


rule comm_share:
    """Communication share of NEST's Mixtral plans on the fat tree and the spine-leaf."""
    input:
        plans=lambda wc: _point_files("plans", comm_share_points()),
        evaluations=lambda wc: _point_files("evaluations", comm_share_points()),
        claims="config/paper/claims.yaml",
    output:
        csv=report("results/comm_share.csv", category="Tables", subcategory="comm_share"),
        md="results/comm_share.md",
    log:
        "logs/tables/comm_share.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=15,
    conda:
        "../envs/nest.yaml"
    params:
        cfg=lambda wc: tables_cfg("comm_share"),
        code=CODE,
    script:
        "../scripts/table_comm.py"


EXPERIMENTS["comm_share"] = lambda: rules.comm_share.output
