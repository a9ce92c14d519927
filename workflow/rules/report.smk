rule collect_results:
    """Evaluations of one figure -> results CSV."""
    input:
        evaluations=figure_evaluations,
        plans=figure_plans,
    output:
        "results/{figure}.csv",
    log:
        "logs/collect_results/{figure}.log",
    conda:
        "../envs/nest.yaml",
    script:
        "../scripts/collect_results.py"


rule plot_figure:
    """Results CSV -> figure (PNG and PDF)."""
    input:
        "results/{figure}.csv",
    output:
        png="figures/{figure}.png",
        pdf="figures/{figure}.pdf",
        table="results/{figure}_table.csv",
    log:
        "logs/plot_figure/{figure}.log",
    conda:
        "../envs/nest.yaml",
    params:
        title=lambda wc: config["figures"][wc.figure]["title"],
    script:
        "../scripts/plot_figure.py"


rule summarize_figure:
    """Results CSV -> NEST's gain over each planner beside the paper's claim (Markdown)."""
    input:
        csv="results/{figure}.csv",
        claims="config/paper/claims.yaml",
    output:
        "results/{figure}_summary.md",
    log:
        "logs/summarize_figure/{figure}.log",
    conda:
        "../envs/nest.yaml"
    script:
        "../scripts/summarize_figure.py"
