rule plan:
    """Layer graph x cluster -> one planner's plan (or a no-plan record with the reason) and its
    evaluation by the one shared evaluator (nest.point: the stored plan reads back as the plan
    scored). One job per point: a process start costs about as much as a small solve."""
    input:
        graph="results/graphs/{model}/mbs{mbs}.json",
        cluster=cluster_files,
        registry="config/planners.yaml",
        space="config/search_space.yaml",
        training="config/training.yaml",
        manual="config/paper/manual_configs.yaml",
    output:
        plan="results/plans/{planner}/{model}/{cluster}/{num_devices}/mbs{mbs}.json",
        evaluation="results/evaluations/{planner}/{model}/{cluster}/{num_devices}/mbs{mbs}.json",
    log:
        "logs/plan/{planner}/{model}/{cluster}/{num_devices}/mbs{mbs}.log",
    conda:
        "../envs/nest.yaml",
    params:
        planner=lambda wc: wc.planner,
        model=lambda wc: wc.model,
        cluster=lambda wc: wc.cluster,
        num_devices=lambda wc: int(wc.num_devices),
    script:
        "../scripts/plan.py"
