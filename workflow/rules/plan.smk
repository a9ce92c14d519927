rule plan:
    """Layer graph x cluster -> one planner's plan (or a no-plan record with the reason) and its
    evaluation by the one shared evaluator (nest.experiments.run_point: the stored plan reads back as the plan
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


# ---- every planner of one configured point in one job ---------------------------------------
# The points the run's experiments read (the figures' grids and Figure 2's, tables.smk) are made
# by one job per point, every planner the config names there in one process: the graph is read
# and verified once, the cost tables built once and the imports paid once, where one job per
# planner paid them nine times (the default run: 60 jobs instead of 525). A rule whose outputs
# have no wildcards wins over `plan` for the same file (Snakemake's rule order), so `plan` still
# makes any other point asked for by name. One job per point, not per figure: a recomputed point
# (a corrupt file moved aside) reruns only its own planners.


for (_pm, _pc, _pn, _pb), _pp in plan_groups().items():

    rule:
        name:
            _rule_name(_pm, _pc, _pn, _pb)
        input:
            graph=graph_file(_pm, _pb),
            cluster=_cluster_files(_pc),
            registry="config/planners.yaml",
            space="config/search_space.yaml",
            training="config/training.yaml",
            manual="config/paper/manual_configs.yaml",
        output:
            plans=[point_file("plans", Point(p, _pm, _pc, _pn, None, _pb)) for p in _pp],
            evaluations=[point_file("evaluations", Point(p, _pm, _pc, _pn, None, _pb))
                         for p in _pp],
        log:
            f"logs/plan/{_pm}/{_pc}/{_pn}/{_pb}.log",
        threads: 1
        resources:
            mem_mb=4000,
            runtime=240,
        conda:
            "../envs/nest.yaml"
        params:
            planners=_pp,
            model=_pm,
            cluster=_pc,
            num_devices=_pn,
            settings=batch_settings(_pb),
            code=CODE,
        script:
            "../scripts/plan_points.py"
