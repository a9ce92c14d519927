# The headline verdicts under the cost model's own error (nest/experiments/robustness.py): the figures' gains,
# the decomposition and the co-design cells rerun with compute and communication times scaled
# (training setting cost_scale). One wildcard per perturbation ({scale}: c<compute>_m<comm>), so
# every point is cached per perturbation and an interrupted run resumes.
from nest.experiments.robustness import SCALE_RE, parse_scale


wildcard_constraints:
    scale=SCALE_RE,


rule robustness_point:
    """One model on one cluster (every device count of the robustness figures) under every
    perturbed cost model, in one process (a process start and the solver's first compile cost
    more than most solves), one file per perturbation: the planners re-planned (nest.experiments.run_point,
    under the runtime guard) and those of `robustness.rescore` keeping their unperturbed plan
    (the figures' plan rule), scored by the perturbed evaluator."""
    input:
        graph=lambda wc: graph_file(wc.model, wc.batch),
        cluster=cluster_files,
        registry="config/planners.yaml",
        space="config/search_space.yaml",
        training="config/training.yaml",
        manual="config/paper/manual_configs.yaml",
        rescored=lambda wc: robustness_rescored_plans(wc),
    output:
        [f"results/robustness/{s}/{{model}}/{{cluster}}/{{batch}}.json"
         for s in robustness_scales()],
    log:
        "logs/robustness/{model}/{cluster}/{batch}.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=240,
    conda:
        "../envs/nest.yaml"
    params:
        scales=lambda wc: [parse_scale(s) for s in robustness_scales()],
        points=lambda wc: robustness_jobs()[(wc.model, wc.cluster, wc.batch)],
        settings=lambda wc: batch_settings(wc.batch),
        code=CODE,
    script:
        "../scripts/robustness_point.py"


rule robustness_codesign:
    """The co-design cells of `robustness.codesign_num_devices` under every perturbed cost model,
    in one process, one CSV per perturbation (points cached under
    results/robustness/codesign/<scale>/, keyed by the inputs' digest, so a rerun resumes)."""
    input:
        unpack(codesign_inputs),
    output:
        [f"results/robustness/codesign/{s}.csv" for s in robustness_scales()],
    log:
        "logs/robustness/codesign.log",
    threads: 1
    resources:
        mem_mb=6000,
        runtime=240,
    conda:
        "../envs/nest.yaml"
    params:
        cfg=lambda wc: config["codesign"],
        num_devices=lambda wc: config["robustness"]["codesign_num_devices"],
        scales=lambda wc: [parse_scale(s) for s in robustness_scales()],
        code=CODE,
    script:
        "../scripts/robustness_codesign.py"


rule robustness:
    """The unperturbed run's CSVs and every perturbation's points and co-design sweeps ->
    results/robustness.csv (experiment, quantity, compute_scale, comm_scale, value, points) and
    results/robustness.md (per quantity its range and whether its direction holds)."""
    input:
        unpack(robustness_inputs),
    output:
        csv=report("results/robustness.csv", category="Robustness", subcategory="robustness"),
        md="results/robustness.md",
    log:
        "logs/robustness/collect.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=15,
    conda:
        "../envs/nest.yaml"
    params:
        cfg=lambda wc: robustness_cfg(),
        code=CODE,
    script:
        "../scripts/robustness.py"


EXPERIMENTS["robustness"] = lambda: list(rules.robustness.output)
