# NEST's gain decomposed (capabilities switched off one at a time) and the network co-design sweep.
# Registers its experiments in EXPERIMENTS (common.smk); its config lives under its own keys.


rule decomposition_point:
    """Every ablation of the decomposition on one point, in one process (a process start costs
    about as much as a small solve): their plans and evaluations (nest.experiments.run_point) in one JSON. A
    planner still running when the job nears its runtime gives a `crashed` record (plan.smk)."""
    input:
        graph=lambda wc: graph_file(wc.model, wc.batch),
        cluster=cluster_files,
        registry="config/planners.yaml",
        space="config/search_space.yaml",
        training="config/training.yaml",
    output:
        "results/decomposition/{model}/{cluster}/{num_devices}/{batch}.json",
    log:
        "logs/decomposition/{model}/{cluster}/{num_devices}/{batch}.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=240,
    conda:
        "../envs/nest.yaml"
    params:
        planners=lambda wc: config["decomposition"]["planners"],
        settings=lambda wc: batch_settings(wc.batch),
        code=CODE,
    script:
        "../scripts/decomposition_point.py"


rule decomposition_collect:
    """NEST's evaluations (the figures' plan rule) and every ablation's (decomposition_point)
    on the decomposition's points -> results CSV."""
    input:
        evaluations=lambda wc: decomposition_files("evaluations"),
        plans=lambda wc: decomposition_files("plans"),
        points=lambda wc: decomposition_files("points"),
    output:
        "results/decomposition.csv",
    log:
        "logs/decomposition/collect.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=15,
    conda:
        "../envs/nest.yaml"
    params:
        code=CODE,
    script:
        "../scripts/decomposition_collect.py"


rule decomposition_report:
    """Results CSV -> per ablation and cluster T(ablation) / T(NEST) (table, Markdown, figure)."""
    input:
        "results/decomposition.csv",
    output:
        table=report("results/decomposition_table.csv", category="Decomposition", subcategory="decomposition"),
        md="results/decomposition.md",
        png=report("figures/decomposition.png", category="Decomposition", subcategory="decomposition"),
        pdf="figures/decomposition.pdf",
    log:
        "logs/decomposition/report.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=15,
    conda:
        "../envs/nest.yaml"
    params:
        reference=lambda wc: config["decomposition"].get("reference", "nest"),
        planners=lambda wc: config["decomposition"]["planners"],
        code=CODE,
    script:
        "../scripts/decomposition_report.py"


EXPERIMENTS["decomposition"] = lambda: [
    *rules.decomposition_collect.output, *rules.decomposition_report.output]


rule codesign:
    """Network co-design sweep: per inter-node bandwidth x oversubscription x size, NEST vs the
    flat-network plan, both scored on that network. Points are cached in results/codesign/
    (keyed by a digest of the inputs), so an interrupted run resumes."""
    input:
        unpack(codesign_inputs),
    output:
        csv=report("results/codesign.csv", category="Decomposition", subcategory="codesign"),
        md="results/codesign.md",
        png=report("figures/codesign.png", category="Decomposition", subcategory="codesign"),
        pdf="figures/codesign.pdf",
    log:
        "logs/codesign.log",
    threads: 1
    resources:
        mem_mb=6000,
        runtime=240,
    conda:
        "../envs/nest.yaml"
    params:
        cfg=lambda wc: config["codesign"],
        cache=lambda wc, output: os.path.splitext(output.csv)[0],
        code=CODE,
    script:
        "../scripts/codesign.py"


EXPERIMENTS["codesign"] = lambda: list(rules.codesign.output)
