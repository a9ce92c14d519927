rule plan:
    """Layer graph x cluster -> one planner's plan (or a no-plan record with the reason) and its
    evaluation by the one shared evaluator (nest.point: the stored plan reads back as the plan
    scored). One job per point: a process start costs about as much as a small solve. The file
    name states the micro-batch size and any global batch / sequence length of the figure that
    differs from the default (common.smk: batch_name). A planner that crashes, or that is still
    running two minutes before the rule's runtime (a hang: searches stop on counts), gives a
    `crashed` record with a one-line reason; the traceback goes to the log."""
    input:
        graph=lambda wc: graph_file(wc.model, wc.batch),
        cluster=cluster_files,
        registry="config/planners.yaml",
        space="config/search_space.yaml",
        training="config/training.yaml",
        manual="config/paper/manual_configs.yaml",
    output:
        plan="results/plans/{planner}/{model}/{cluster}/{num_devices}/{batch}.json",
        evaluation="results/evaluations/{planner}/{model}/{cluster}/{num_devices}/{batch}.json",
    log:
        "logs/plan/{planner}/{model}/{cluster}/{num_devices}/{batch}.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=120,
    conda:
        "../envs/nest.yaml"
    params:
        planner=lambda wc: wc.planner,
        model=lambda wc: wc.model,
        cluster=lambda wc: wc.cluster,
        num_devices=lambda wc: int(wc.num_devices),
        settings=lambda wc: batch_settings(wc.batch),
        code=CODE,
    script:
        "../scripts/plan.py"
