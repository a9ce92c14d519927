rule evaluate_plan:
    """Plan -> evaluation by the one shared evaluator."""
    input:
        plan="results/plans/{planner}/{model}/{cluster}/{num_devices}/mbs{mbs}.json",
        graph="results/graphs/{model}/mbs{mbs}.json",
        cluster=cluster_files,
        training="config/training.yaml",
    output:
        "results/evaluations/{planner}/{model}/{cluster}/{num_devices}/mbs{mbs}.json",
    log:
        "logs/evaluate/{planner}/{model}/{cluster}/{num_devices}/mbs{mbs}.log",
    conda:
        "../envs/nest.yaml",
    script:
        "../scripts/evaluate.py"
