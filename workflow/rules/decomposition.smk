# NEST's gain decomposed (capabilities switched off one at a time) and the network co-design sweep.
# Registers its experiments in EXPERIMENTS (common.smk); its config lives under its own keys.


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
        cache=lambda wc, output: os.path.splitext(output.csv)[0],
    script:
        "../scripts/codesign.py"


EXPERIMENTS["codesign"] = lambda: list(rules.codesign.output)
