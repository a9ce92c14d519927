rule collect_results:
    """Evaluations of one figure -> results CSV."""
    input:
        evaluations=figure_evaluations,
        plans=figure_plans,
    output:
        "results/{figure}.csv",
    log:
        "logs/collect_results/{figure}.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=15,
    conda:
        "../envs/nest.yaml",
    params:
        code=CODE,
    script:
        "../scripts/collect_results.py"


rule plot_figure:
    """Results CSV -> figure (PNG and PDF)."""
    input:
        "results/{figure}.csv",
    output:
        png=report("figures/{figure}.png", category="Figures",
                   subcategory="{figure}"),
        pdf="figures/{figure}.pdf",
        table=report("results/{figure}_table.csv", category="Figures",
                     subcategory="{figure}"),
    log:
        "logs/plot_figure/{figure}.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=15,
    conda:
        "../envs/nest.yaml",
    params:
        title=lambda wc: config["figures"][wc.figure]["title"],
        code=CODE,
    script:
        "../scripts/plot_figure.py"


rule summarize_figure:
    """Results CSV -> NEST's gain over each planner beside the paper's claim (Markdown)."""
    input:
        csv="results/{figure}.csv",
        claims="config/paper/claims.yaml",
        mfu_table="config/validation/best_published_mfu.yaml",
    output:
        report("results/{figure}_summary.md", category="Figures", subcategory="{figure}"),
    log:
        "logs/summarize_figure/{figure}.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=15,
    conda:
        "../envs/nest.yaml"
    params:
        code=CODE,
    script:
        "../scripts/summarize_figure.py"


rule search_time:
    """Table 4: NEST vs Mist search time, each solve alone in a fresh process. The rule claims
    more threads than any machine has; Snakemake scales that down to every core it was given,
    so it runs nothing beside it (workflow.cores itself is undefined under --report)."""
    input:
        claims="config/paper/claims.yaml",
        registry="config/planners.yaml",
    output:
        csv=report("results/table4_search_time.csv", category="Table 4"),
        md="results/table4_search_time.md",
    log:
        "logs/search_time.log",
    threads: 4096
    resources:
        mem_mb=8000,
        runtime=120,
    conda:
        "../envs/nest.yaml"
    params:
        cfg=lambda wc: config["search_time"],
        code=CODE,
    script:
        "../scripts/search_time.py"


EXPERIMENTS["search_time"] = lambda: rules.search_time.output


rule reproduction_report:
    """Every experiment of the run: the paper's numbers, ours, the difference and why."""
    input:
        csvs=lambda wc: [f"results/{f}.csv" for f in config["run"] if f in config["figures"]],
        claims="config/paper/claims.yaml",
        extra=lambda wc: [t for name in config["run"] if name not in config["figures"]
                          and name != "report" for t in EXPERIMENTS[name]()],
        # the perturbed cost models' headline quantities, when the run makes them
        robustness=lambda wc: (["results/robustness.csv"] if "robustness" in config["run"]
                               else []),
    output:
        report("results/REPRODUCTION.md", category="Reproduction report"),
    log:
        "logs/reproduction_report.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=15,
    conda:
        "../envs/nest.yaml"
    params:
        experiments=lambda wc: [e for e in config["run"] if e not in ("report", "robustness")],
        code=CODE,
    script:
        "../scripts/reproduction_report.py"


EXPERIMENTS["report"] = lambda: rules.reproduction_report.output


rule expected:
    """Rewrite results/expected/ (committed) from this run's CSVs, machine-dependent columns
    dropped: `snakemake -j8 expected` after a change that is meant to move the results."""
    input:
        lambda wc: [f"results/{f}{part}.csv" for f in config["run"] if f in config["figures"]
                    for part in ("", "_table")] + [
            str(t) for f in config["run"] if f in EXPERIMENTS for t in EXPERIMENTS[f]()
            if str(t).endswith(".csv")],
    output:
        directory(f"results/expected/{config.get('expected_name', 'default')}"),
    log:
        "logs/expected.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=15,
    conda:
        "../envs/nest.yaml"
    params:
        code=CODE,
    script:
        "../scripts/expected.py"
